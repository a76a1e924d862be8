#include "tardelli/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "tardelli/core/error.h"

namespace td::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMeta = "meta.json";
constexpr const char* kCrashEnv = "TD_CHECKPOINT_CRASH_AT";

std::string errno_str() {
  return std::strerror(errno);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

std::string manifest_name(int writer) {
  return "MANIFEST." + std::to_string(writer) + ".json";
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The test-only crash hook (see checkpoint.h): exits without unwinding, flushing or running
// destructors, which is what a killed process leaves behind.
void maybe_crash(const char* point) {
  const char* at = std::getenv(kCrashEnv);
  if (at != nullptr && std::strcmp(at, point) == 0) std::_Exit(42);
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    TD_CHECK(r > 0, "checkpoint: cannot write '", path, "': ", errno_str());
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// Closes a descriptor on scope exit (errors on the success path are checked by close_checked).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  void fsync_and_close(const std::string& path) {
    TD_CHECK(::fsync(fd) == 0, "checkpoint: fsync of '", path, "' failed: ", errno_str());
    int f = fd;
    fd = -1;
    TD_CHECK(::close(f) == 0, "checkpoint: close of '", path, "' failed: ", errno_str());
  }
};

Fd create_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TD_CHECK(f.fd >= 0, "checkpoint: cannot create '", path, "': ", errno_str());
  return f;
}

// Makes a directory's entries (creations, renames) durable.
void fsync_dir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  Fd f;
  f.fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TD_CHECK(f.fd >= 0, "checkpoint: cannot open directory '", d, "': ", errno_str());
  f.fsync_and_close(d);
}

std::string parent_of(const std::string& path) {
  std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

// Writes a whole file and fsyncs it (the caller fsyncs the directory).
void write_durable(const std::string& path, const std::string& bytes) {
  Fd f = create_file(path);
  write_all(f.fd, bytes.data(), bytes.size(), path);
  f.fsync_and_close(path);
}

std::string read_whole(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TD_CHECK(f.fd >= 0, "checkpoint: cannot open '", path, "': ", errno_str());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(f.fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    TD_CHECK(r >= 0, "checkpoint: cannot read '", path, "': ", errno_str());
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  TD_CHECK(!ec, "checkpoint: cannot remove '", path, "': ", ec.message());
}

void rename_checked(const std::string& from, const std::string& to) {
  TD_CHECK(::rename(from.c_str(), to.c_str()) == 0, "checkpoint: cannot rename '", from, "' to '",
           to, "': ", errno_str());
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool is_complete(const std::string& dir) {
  return is_file(join(dir, kMeta));
}

std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// Parses one manifest; entries get their writer id.
std::vector<FileEntry> parse_manifest(const std::string& dir, const std::string& name,
                                      std::optional<int> expect_writer) {
  const std::string path = join(dir, name);
  TD_CHECK(is_file(path), "checkpoint '", dir, "': manifest ", name, " is missing");
  json::Value m;
  try {
    m = json::parse(read_whole(path));
  } catch (const Error& e) {
    TD_ERROR("checkpoint '", dir, "': manifest ", name, " is not valid JSON: ", e.what());
  }
  TD_CHECK(m.is_object() && m.find("writer") && m.at("writer").is_int() && m.find("files") &&
               m.at("files").is_array(),
           "checkpoint '", dir, "': manifest ", name,
           " must be {\"writer\": int, \"files\": [...]}");
  const int writer = static_cast<int>(m.at("writer").as_int());
  TD_CHECK(!expect_writer || writer == *expect_writer, "checkpoint '", dir, "': manifest ", name,
           " says writer ", writer);
  std::vector<FileEntry> out;
  for (const auto& f : m.at("files").as_array()) {
    const json::Value* n = f.find("name");
    const json::Value* s = f.find("size");
    const json::Value* c = f.find("crc32");
    TD_CHECK(n && n->is_string() && s && s->is_int() && s->as_int() >= 0 && c && c->is_int() &&
                 c->as_int() >= 0 && c->as_int() <= 0xFFFFFFFFLL,
             "checkpoint '", dir, "': manifest ", name,
             " has an entry that is not {\"name\": str, \"size\": int, \"crc32\": int}");
    out.push_back({n->as_string(), static_cast<uint64_t>(s->as_int()),
                   static_cast<uint32_t>(c->as_int()), writer});
  }
  return out;
}

}  // namespace

// ---- CheckpointWriter ----

CheckpointWriter::CheckpointWriter(std::string final_dir, int writer_id)
    : final_dir_(strip_slashes(std::move(final_dir))),
      tmp_dir_(final_dir_ + ".tmp"),
      writer_id_(writer_id) {
  TD_CHECK(!final_dir_.empty(), "CheckpointWriter: empty directory name");
  TD_CHECK(writer_id >= 0, "CheckpointWriter: writer_id must be >= 0, got ", writer_id);
  std::error_code ec;
  fs::create_directories(parent_of(final_dir_), ec);
  TD_CHECK(!ec, "CheckpointWriter: cannot create '", parent_of(final_dir_), "': ", ec.message());
  if (writer_id_ == 0) remove_tree(tmp_dir_);  // a stale one from a crash
  fs::create_directories(tmp_dir_, ec);
  TD_CHECK(!ec, "CheckpointWriter: cannot create '", tmp_dir_, "': ", ec.message());
  // Another writer's stale manifest of the same id would be mistaken for ours.
  std::error_code ignored;
  fs::remove(join(tmp_dir_, manifest_name(writer_id_)), ignored);
}

std::string CheckpointWriter::begin_file(const std::string& file_name) {
  TD_CHECK(!finished_, "CheckpointWriter '", final_dir_, "': cannot add '", file_name,
           "' after finish()/commit()");
  TD_CHECK(!file_name.empty() && file_name.find('/') == std::string::npos && file_name[0] != '.' &&
               file_name != kMeta && file_name.rfind("MANIFEST.", 0) != 0,
           "CheckpointWriter '", final_dir_, "': bad file name '", file_name,
           "' (a plain name: no '/', not starting with '.', not meta.json or MANIFEST.*)");
  for (const auto& e : entries_)
    TD_CHECK(e.name != file_name, "CheckpointWriter '", final_dir_, "': '", file_name,
             "' was already written");
  return join(tmp_dir_, file_name);
}

void CheckpointWriter::record(const std::string& file_name, FileDigest d) {
  entries_.push_back({file_name, d.size, d.crc32, writer_id_});
}

void CheckpointWriter::write_tensors(const std::string& file_name, const NamedTensors& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  const std::string path = begin_file(file_name);
  save_safetensors(path, tensors, metadata);  // fsyncs the file
  // Note [CRC of the bytes on disk]: the CRC is computed by reading the file back, so the
  // manifest describes what actually reached the file system.
  record(file_name, crc32_file(path));
  maybe_crash("after_tensors");
}

void CheckpointWriter::write_bytes(const std::string& file_name, const std::string& bytes) {
  const std::string path = begin_file(file_name);
  write_durable(path, bytes);
  record(file_name, {bytes.size(), crc32(bytes.data(), bytes.size())});
}

void CheckpointWriter::copy_file(const std::string& file_name, const std::string& src_path) {
  const std::string path = begin_file(file_name);
  Fd src;
  src.fd = ::open(src_path.c_str(), O_RDONLY | O_CLOEXEC);
  TD_CHECK(src.fd >= 0, "CheckpointWriter: cannot open '", src_path, "': ", errno_str());
  Fd dst = create_file(path);
  FileDigest d;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t r = ::read(src.fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    TD_CHECK(r >= 0, "CheckpointWriter: cannot read '", src_path, "': ", errno_str());
    if (r == 0) break;
    write_all(dst.fd, buf.data(), static_cast<size_t>(r), path);
    d.crc32 = crc32(buf.data(), static_cast<size_t>(r), d.crc32);
    d.size += static_cast<uint64_t>(r);
  }
  dst.fsync_and_close(path);
  record(file_name, d);
}

void CheckpointWriter::finish() {
  if (finished_) return;
  json::Value files = json::Array{};
  for (const auto& e : entries_) {
    json::Value f = json::Object{};
    f.set("name", e.name);
    f.set("size", static_cast<int64_t>(e.size));
    f.set("crc32", static_cast<int64_t>(e.crc32));
    files.push_back(std::move(f));
  }
  json::Value m = json::Object{};
  m.set("writer", writer_id_);
  m.set("files", std::move(files));
  write_durable(join(tmp_dir_, manifest_name(writer_id_)), json::dump(m, 1) + "\n");
  fsync_dir(tmp_dir_);
  finished_ = true;
}

std::string CheckpointWriter::commit(const json::Value& meta, int num_writers) {
  const std::string who = "CheckpointWriter '" + final_dir_ + "': commit";
  TD_CHECK(writer_id_ == 0, who, " must be called by writer 0, not writer ", writer_id_);
  TD_CHECK(!committed_, who, " was already called");
  TD_CHECK(num_writers >= 1, who, ": num_writers must be >= 1, got ", num_writers);
  TD_CHECK(meta.is_object(), who, ": meta must be a JSON object, got ",
           json::type_name(meta.type()));
  for (const char* k : {"format", "version", "manifests"})
    TD_CHECK(meta.find(k) == nullptr, who, ": meta key '", k, "' is reserved");
  finish();

  // Every expected manifest, no unexpected one, distinct names, files present and sized.
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(tmp_dir_, ec)) {
    const std::string n = de.path().filename().string();
    int w = -1;
    char tail[8] = {0};
    if (std::sscanf(n.c_str(), "MANIFEST.%d.%5s", &w, tail) == 2 && std::string(tail) == "json")
      TD_CHECK(w >= 0 && w < num_writers, who, ": found ", n, " but num_writers is ", num_writers);
  }
  TD_CHECK(!ec, who, ": cannot list '", tmp_dir_, "': ", ec.message());
  json::Value manifests = json::Array{};
  std::set<std::string> names;
  for (int w = 0; w < num_writers; ++w) {
    for (const auto& e : parse_manifest(tmp_dir_, manifest_name(w), w)) {
      TD_CHECK(names.insert(e.name).second, who, ": file '", e.name,
               "' is listed by more than one writer");
      const std::string p = join(tmp_dir_, e.name);
      TD_CHECK(is_file(p), who, ": file '", e.name, "' of writer ", w, " is missing");
      TD_CHECK(fs::file_size(p) == e.size, who, ": file '", e.name, "' has ", fs::file_size(p),
               " bytes, its manifest says ", e.size);
    }
    manifests.push_back(manifest_name(w));
  }

  json::Value full = json::Object{};
  full.set("format", kFormatName);
  full.set("version", kFormatVersion);
  full.set("manifests", std::move(manifests));
  for (const auto& [k, v] : meta.as_object()) full.set(k, v);
  write_durable(join(tmp_dir_, kMeta), json::dump(full, 1) + "\n");
  fsync_dir(tmp_dir_);
  maybe_crash("before_rename");

  // Note [Commit protocol] in checkpoint.h.
  const std::string parent = parent_of(final_dir_);
  const std::string old = final_dir_ + ".old";
  if (fs::exists(final_dir_)) {
    remove_tree(old);  // garbage from a crash after an earlier rename-in
    rename_checked(final_dir_, old);
    fsync_dir(parent);
    maybe_crash("after_rename_aside");
  }
  rename_checked(tmp_dir_, final_dir_);
  fsync_dir(parent);
  if (fs::exists(old)) {
    remove_tree(old);
    fsync_dir(parent);
  }
  committed_ = true;
  return final_dir_;
}

// ---- CheckpointReader ----

CheckpointReader::CheckpointReader(const std::string& dir_in) {
  const std::string dir = strip_slashes(dir_in);
  if (is_complete(dir)) {
    path_ = dir;
  } else if (is_complete(dir + ".old")) {
    path_ = dir + ".old";  // recovery rule: a crash between the two renames of a commit
  } else {
    TD_ERROR("checkpoint '", dir, "' is not a complete checkpoint (no ", kMeta, ")",
             fs::exists(dir + ".tmp") ? "; an unfinished save left " + dir + ".tmp" : "");
  }
  try {
    meta_ = json::parse(read_whole(join(path_, kMeta)));
  } catch (const Error& e) {
    TD_ERROR("checkpoint '", path_, "': meta.json is not valid JSON: ", e.what());
  }
  TD_CHECK(meta_.is_object(), "checkpoint '", path_, "': meta.json is not a JSON object");
  const json::Value* fmt = meta_.find("format");
  TD_CHECK(fmt && fmt->is_string() && fmt->as_string() == kFormatName, "checkpoint '", path_,
           "': meta.json has no \"format\": \"", kFormatName, "\"");
  const json::Value* ver = meta_.find("version");
  TD_CHECK(ver && ver->is_int(), "checkpoint '", path_, "': meta.json has no integer version");
  TD_CHECK(ver->as_int() >= 1 && ver->as_int() <= kFormatVersion, "checkpoint '", path_,
           "': format version ", ver->as_int(), " is not supported (this build reads up to ",
           kFormatVersion, ")");
  const json::Value* mans = meta_.find("manifests");
  TD_CHECK(mans && mans->is_array(), "checkpoint '", path_, "': meta.json has no manifests list");
  std::set<std::string> names;
  for (const auto& m : mans->as_array()) {
    TD_CHECK(m.is_string() && m.as_string().find('/') == std::string::npos, "checkpoint '", path_,
             "': bad manifest name in meta.json");
    for (auto& e : parse_manifest(path_, m.as_string(), std::nullopt)) {
      TD_CHECK(names.insert(e.name).second, "checkpoint '", path_, "': file '", e.name,
               "' is listed twice");
      files_.push_back(std::move(e));
    }
  }
  std::sort(files_.begin(), files_.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });
}

bool CheckpointReader::has_file(const std::string& name) const {
  return std::any_of(files_.begin(), files_.end(),
                     [&](const FileEntry& e) { return e.name == name; });
}

const FileEntry& CheckpointReader::file(const std::string& name) const {
  for (const auto& e : files_)
    if (e.name == name) return e;
  std::string list;
  for (const auto& e : files_) list += (list.empty() ? "" : ", ") + e.name;
  TD_ERROR("checkpoint '", path_, "' has no file '", name, "' (files: ", list, ")");
}

void CheckpointReader::verify_file(const FileEntry& e) const {
  const std::string p = join(path_, e.name);
  TD_CHECK(is_file(p), "checkpoint '", path_, "': file '", e.name, "' is missing");
  const FileDigest d = crc32_file(p);
  TD_CHECK(d.size == e.size, "checkpoint '", path_, "': file '", e.name, "' has ", d.size,
           " bytes, expected ", e.size, " (manifest)");
  TD_CHECK(d.crc32 == e.crc32, "checkpoint '", path_, "': file '", e.name, "' is damaged: CRC-32 ",
           hex32(d.crc32), ", expected ", hex32(e.crc32), " (manifest)");
}

void CheckpointReader::verify() const {
  for (const auto& e : files_) verify_file(e);
}

SafetensorsFile CheckpointReader::read_tensors(const std::string& name) const {
  verify_file(file(name));
  return load_safetensors(join(path_, name));
}

std::string CheckpointReader::read_bytes(const std::string& name) const {
  const FileEntry& e = file(name);
  std::string bytes = read_whole(join(path_, name));
  TD_CHECK(bytes.size() == e.size, "checkpoint '", path_, "': file '", e.name, "' has ",
           bytes.size(), " bytes, expected ", e.size, " (manifest)");
  const uint32_t c = crc32(bytes.data(), bytes.size());
  TD_CHECK(c == e.crc32, "checkpoint '", path_, "': file '", e.name, "' is damaged: CRC-32 ",
           hex32(c), ", expected ", hex32(e.crc32), " (manifest)");
  return bytes;
}

// ---- the checkpoint root ----

std::string step_dir_name(int64_t step) {
  TD_CHECK(step >= 0, "step_dir_name: step must be >= 0, got ", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

void update_latest(const std::string& root_in, const std::string& name) {
  const std::string root = strip_slashes(root_in);
  TD_CHECK(
      !name.empty() && name.find('/') == std::string::npos && name.find('\n') == std::string::npos,
      "update_latest: '", name, "' is not a plain directory name");
  std::error_code ec;
  fs::create_directories(root, ec);
  TD_CHECK(!ec, "update_latest: cannot create '", root, "': ", ec.message());
  const std::string tmp = join(root, "latest.tmp");
  write_durable(tmp, name + "\n");
  rename_checked(tmp, join(root, "latest"));
  fsync_dir(root);
}

std::optional<std::string> find_latest(const std::string& root_in) {
  const std::string root = strip_slashes(root_in);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  auto resolve = [&](const std::string& name) -> std::optional<std::string> {
    if (is_complete(join(root, name))) return join(root, name);
    if (is_complete(join(root, name + ".old"))) return join(root, name + ".old");
    return std::nullopt;
  };
  const std::string latest = join(root, "latest");
  if (is_file(latest)) {
    std::string name = read_whole(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r'))
      name.pop_back();
    if (!name.empty() && name.find('/') == std::string::npos) {
      if (auto p = resolve(name)) return p;
    }
  }
  // The highest complete step_<digits> (or its .old).
  int64_t best = -1;
  std::string best_name;
  for (const auto& de : fs::directory_iterator(root, ec)) {
    std::string n = de.path().filename().string();
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".old") == 0) n.resize(n.size() - 4);
    if (n.size() <= 5 || n.rfind("step_", 0) != 0) continue;
    const std::string digits = n.substr(5);
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const int64_t step = std::stoll(digits);
    if (step > best && resolve(n)) {
      best = step;
      best_name = n;
    }
  }
  if (best < 0) return std::nullopt;
  return resolve(best_name);
}

}  // namespace td::checkpoint
