#pragma once
// Checkpoint directories, written so that a crash at any instant never damages the previous
// checkpoint and never leaves a directory that looks complete but is not (docs/checkpoints.md).
//
//   DIR/meta.json            {"format": "tardelli-checkpoint", "version": 1,
//                             "manifests": ["MANIFEST.0.json", ...], ...the caller's meta...}
//   DIR/MANIFEST.<w>.json    {"writer": w, "files": [{"name", "size", "crc32"}, ...]}
//   DIR/<files>              safetensors, raw bytes (tokenizer files, images, ...)
//
// Note [Commit protocol]: every file goes into DIR.tmp (a stale DIR.tmp from an earlier crash is
// removed first) and is fsync'ed; its size and CRC-32 go into its writer's manifest. commit()
// writes meta.json LAST, fsyncs the directory, then renames DIR.tmp to DIR. meta.json is the
// completeness mark: a directory without it is never used. Overwriting an existing DIR (saving
// the same step again) renames it to DIR.old first, renames the new one in, then deletes
// DIR.old. Recovery rule: a reader that finds DIR.old but no DIR (a crash between the two
// renames) uses DIR.old, which is the complete previous checkpoint; CheckpointReader and
// find_latest do so. A reader that finds both uses DIR (DIR.old is garbage the next commit of
// DIR deletes).
//
// Note [Sharded saving]: each rank writes its own files with its own CheckpointWriter (writer_id
// = rank) into the same DIR.tmp and calls finish() (its manifest); after a barrier, rank 0 alone
// calls commit(meta, world_size), which checks that every manifest is there. Rank 0 must
// construct its writer (which clears a stale DIR.tmp) before the other ranks construct theirs:
// construct on rank 0, barrier, construct on the others. A single process just calls commit().
//
// Test-only hook: the environment variable TD_CHECKPOINT_CRASH_AT = "after_tensors" (after each
// write_tensors), "before_rename" (meta.json written, nothing renamed) or "after_rename_aside"
// (an existing DIR moved to DIR.old, the new one not yet in place) makes the writer call
// std::_Exit(42) at that point, so tests can check what a crash there leaves behind.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tardelli/checkpoint/crc32.h"
#include "tardelli/checkpoint/safetensors.h"
#include "tardelli/core/json.h"

namespace td::checkpoint {

inline constexpr const char* kFormatName = "tardelli-checkpoint";
inline constexpr int64_t kFormatVersion = 1;

struct FileEntry {
  std::string name;  // relative to the checkpoint directory
  uint64_t size = 0;
  uint32_t crc32 = 0;
  int writer = 0;  // the writer_id that wrote it
};

class CheckpointWriter {
 public:
  // Prepares final_dir + ".tmp" (writer 0 removes a stale one and creates it fresh; the others
  // create it if it is missing). The parent of final_dir is created if needed.
  explicit CheckpointWriter(std::string final_dir, int writer_id = 0);
  // An uncommitted writer leaves its .tmp directory behind (like a crash would); the next
  // writer 0 for the same directory removes it.
  ~CheckpointWriter() = default;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Each writes one file (a plain name: no '/', not starting with '.', not meta.json or
  // MANIFEST.*, not written before by this writer), fsyncs it and records its size and CRC.
  void write_tensors(const std::string& file_name, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata = {});
  void write_bytes(const std::string& file_name, const std::string& bytes);
  void copy_file(const std::string& file_name, const std::string& src_path);

  // Writes MANIFEST.<writer_id>.json and fsyncs it and the directory. No file may be added after.
  void finish();
  // Writer 0 only: finish() if not done yet, check that MANIFEST.0 .. MANIFEST.<num_writers-1>
  // exist and name distinct files that are all present with their recorded sizes, write
  // meta.json = {"format", "version", "manifests"} followed by `meta`'s members (an object that
  // must not use those three keys), fsync, and rename the directory into place (Note [Commit
  // protocol]). Returns final_dir. A writer commits at most once.
  std::string commit(const json::Value& meta = json::Object{}, int num_writers = 1);

  const std::string& final_dir() const { return final_dir_; }
  const std::string& tmp_dir() const { return tmp_dir_; }
  int writer_id() const { return writer_id_; }
  const std::vector<FileEntry>& entries() const { return entries_; }

 private:
  std::string begin_file(const std::string& file_name);  // checks, returns the tmp path
  void record(const std::string& file_name, FileDigest digest);

  std::string final_dir_, tmp_dir_;
  int writer_id_;
  std::vector<FileEntry> entries_;
  bool finished_ = false;
  bool committed_ = false;
};

class CheckpointReader {
 public:
  // Opens a committed checkpoint: dir, or dir + ".old" when only that exists (Note [Commit
  // protocol]). Reads meta.json (format and version checked) and every manifest; td::Error
  // naming the directory when it is not a complete checkpoint.
  explicit CheckpointReader(const std::string& dir);

  // The directory actually read (dir or dir.old).
  const std::string& path() const { return path_; }
  const json::Value& meta() const { return meta_; }
  // Every file of every manifest, ordered by name.
  const std::vector<FileEntry>& files() const { return files_; }
  bool has_file(const std::string& name) const;
  const FileEntry& file(const std::string& name) const;  // td::Error listing the files if absent

  // Checks every file's size and CRC; the first mismatch is a td::Error naming the file with
  // expected vs actual values.
  void verify() const;
  // Verify that one file's CRC, then parse it.
  SafetensorsFile read_tensors(const std::string& name) const;
  std::string read_bytes(const std::string& name) const;

 private:
  void verify_file(const FileEntry& e) const;

  std::string path_;
  json::Value meta_;
  std::vector<FileEntry> files_;
};

// "step_00000100" (at least 8 digits); td::Error for a negative step.
std::string step_dir_name(int64_t step);
// Writes root/latest = name + "\n" atomically (latest.tmp, fsync, rename, fsync root).
void update_latest(const std::string& root, const std::string& name);
// The checkpoint to resume from: root/latest's directory when it (or its .old, Note [Commit
// protocol]) holds meta.json; otherwise the complete step_<digits> directory (or, when only
// that exists, step_<digits>.old) with the highest step; *.tmp is ignored. Returns the path
// (root + "/" + name), or nullopt when root holds no complete checkpoint.
std::optional<std::string> find_latest(const std::string& root);

}  // namespace td::checkpoint
