// Checkpoint directories: CRC-32 against known vectors and a bitwise reference, the writer/reader
// round trip, corruption detection, multi-writer commits, the latest/find_latest rules, and
// crash safety (a child process crashes at each point of a commit; the parent checks that what
// find_latest gives is a complete, verified checkpoint: the previous one, or the new one once
// the commit point has passed).
#include "tardelli/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "tardelli/core/error.h"
#include "tardelli/ops/factory.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace ck = td::checkpoint;
using td::DType;
using td::Tensor;
using td::test::error_of;
using td::test::same_bytes;

// The textbook bit-at-a-time CRC-32 (reflected 0xEDB88320), the reference for the tables.
uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return ~c;
}

class Checkpoint : public td::test::TempDirTest {
 protected:
  // A checkpoint whose model.safetensors holds one tensor filled with `value`.
  std::string save(const std::string& dir, float value, bool update = true) {
    ck::CheckpointWriter w(dir);
    w.write_tensors("model.safetensors", {{"w", td::full({4, 3}, value)}});
    w.write_bytes("notes.txt", "value " + std::to_string(value));
    td::json::Value meta = td::json::Object{};
    meta.set("value", static_cast<double>(value));
    std::string out = w.commit(meta);
    if (update) ck::update_latest(fs::path(dir).parent_path().string(), fs::path(dir).filename());
    return out;
  }
  // The value stored by save(), after a full verify.
  static float value_of(const std::string& dir) {
    ck::CheckpointReader r(dir);
    r.verify();
    return r.read_tensors("model.safetensors").at("w").data_ptr<float>()[0];
  }
};

// Known vectors (zlib/PNG CRC-32), chaining, and agreement with the bitwise reference on random
// data of every length 0..200 at every alignment 0..7 (exercises the 8-byte path and the tail).
TEST(Crc32, KnownVectorsAndReference) {
  EXPECT_EQ(ck::crc32("", 0), 0u);
  EXPECT_EQ(ck::crc32("123456789", 9), 0xCBF43926u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(ck::crc32(fox.data(), fox.size()), 0x414FA339u);
  EXPECT_EQ(ck::crc32(fox.data() + 10, fox.size() - 10, ck::crc32(fox.data(), 10)), 0x414FA339u);
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(216);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n <= 200; ++n)
      ASSERT_EQ(ck::crc32(buf.data() + off, n), crc_bitwise(buf.data() + off, n))
          << "offset " << off << " length " << n;
}

// Round trip of tensors, bytes and a copied file; meta.json carries the format, version,
// manifests and the caller's members; nothing is left besides the committed directory.
TEST_F(Checkpoint, RoundTrip) {
  const std::string src = path("tokenizer.json");
  td::test::write_bytes(src, std::string("{\"vocab\": 3}\0binary\xff", 21));
  td::Generator gen(3);
  Tensor a = td::randn({5, 7}, {}, &gen);
  Tensor b = td::arange(0, 10);
  ck::CheckpointWriter w(path("ck"));
  EXPECT_EQ(w.tmp_dir(), path("ck") + ".tmp");
  w.write_tensors("model.safetensors", {{"a", a}, {"b", b}}, {{"k", "v"}});
  w.write_bytes("raw.bin", std::string("\x00\x01\x02", 3));
  w.copy_file("tokenizer.json", src);
  td::json::Value meta = td::json::Object{};
  meta.set("step", 12);
  EXPECT_EQ(w.commit(meta), path("ck"));
  EXPECT_FALSE(fs::exists(path("ck.tmp")));
  EXPECT_FALSE(fs::exists(path("ck.old")));

  ck::CheckpointReader r(path("ck"));
  EXPECT_EQ(r.meta().at("format").as_string(), "tardelli-checkpoint");
  EXPECT_EQ(r.meta().at("version").as_int(), 1);
  EXPECT_EQ(r.meta().at("manifests").as_array()[0].as_string(), "MANIFEST.0.json");
  EXPECT_EQ(r.meta().at("step").as_int(), 12);
  ASSERT_EQ(r.files().size(), 3u);
  EXPECT_EQ(r.files()[0].name, "model.safetensors");  // ordered by name
  EXPECT_EQ(r.file("raw.bin").size, 3u);
  EXPECT_EQ(r.file("raw.bin").crc32, ck::crc32("\x00\x01\x02", 3));
  EXPECT_EQ(r.file("model.safetensors").size, fs::file_size(path("ck/model.safetensors")));
  r.verify();
  auto f = r.read_tensors("model.safetensors");
  EXPECT_TRUE(same_bytes(f.at("a"), a));
  EXPECT_TRUE(same_bytes(f.at("b"), b));
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_EQ(r.read_bytes("raw.bin"), std::string("\x00\x01\x02", 3));
  EXPECT_EQ(r.read_bytes("tokenizer.json"), td::test::read_bytes(src));
  EXPECT_TRUE(r.has_file("raw.bin"));
  EXPECT_FALSE(r.has_file("nope"));
  EXPECT_NE(error_of([&] { r.read_bytes("nope"); }).find("no file 'nope'"), std::string::npos);
}

// Flipping one byte of any file, or truncating it, is caught by verify() and by the readers,
// with an error naming the file; the other files still read.
TEST_F(Checkpoint, CorruptionIsDetected) {
  save(path("ck"), 1.5f, false);
  const std::string p = path("ck/model.safetensors");
  std::string bytes = td::test::read_bytes(p);
  bytes[bytes.size() - 3] ^= 0x01;  // inside the tensor data: still parses as safetensors
  td::test::write_bytes(p, bytes);
  ck::CheckpointReader r(path("ck"));
  std::string e = error_of([&] { r.verify(); });
  EXPECT_NE(e.find("'model.safetensors' is damaged: CRC-32"), std::string::npos) << e;
  e = error_of([&] { r.read_tensors("model.safetensors"); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_EQ(r.read_bytes("notes.txt"), "value 1.500000");

  td::test::write_bytes(path("ck/notes.txt"), "value 1.5");
  e = error_of([&] { r.read_bytes("notes.txt"); });
  EXPECT_NE(e.find("'notes.txt' has 9 bytes, expected 14"), std::string::npos) << e;
  fs::remove(path("ck/notes.txt"));
  e = error_of([&] { ck::CheckpointReader(path("ck")).verify(); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;  // first by name
}

// Several writers (ranks) fill one directory; writer 0 commits after checking every manifest.
TEST_F(Checkpoint, MultipleWriters) {
  ck::CheckpointWriter w0(path("ck"));
  ck::CheckpointWriter w1(path("ck"), 1);
  w0.write_bytes("rank0.bin", "zero");
  w1.write_bytes("rank1.bin", "one");
  // Writer 1 has not finished: its manifest is missing.
  std::string e = error_of([&] { w0.commit(td::json::Object{}, 2); });
  EXPECT_NE(e.find("MANIFEST.1.json is missing"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(path("ck")));
  w1.finish();
  EXPECT_NE(error_of([&] { w1.write_bytes("late.bin", "x"); }).find("after finish"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w1.commit(); }).find("writer 0"), std::string::npos);
  w0.commit(td::json::Object{}, 2);
  ck::CheckpointReader r(path("ck"));
  r.verify();
  EXPECT_EQ(r.meta().at("manifests").size(), 2u);
  EXPECT_EQ(r.file("rank1.bin").writer, 1);
  EXPECT_EQ(r.read_bytes("rank1.bin"), "one");
  EXPECT_EQ(r.read_bytes("rank0.bin"), "zero");
}

// Two writers naming the same file, or a manifest beyond num_writers, fail the commit.
TEST_F(Checkpoint, MultipleWritersConflicts) {
  {
    ck::CheckpointWriter w0(path("a"));
    ck::CheckpointWriter w1(path("a"), 1);
    w0.write_bytes("x.bin", "0");
    w1.write_bytes("y.bin", "1");
    w1.finish();
    std::string e = error_of([&] { w0.commit(); });  // num_writers 1, MANIFEST.1 exists
    EXPECT_NE(e.find("MANIFEST.1.json but num_writers is 1"), std::string::npos) << e;
  }
  ck::CheckpointWriter w0(path("b"));
  ck::CheckpointWriter w1(path("b"), 1);
  w1.write_bytes("x.bin", "1");
  w1.finish();
  w0.write_bytes("x.bin", "1");  // the same name (overwrites rank 1's file)
  std::string e = error_of([&] { w0.commit(td::json::Object{}, 2); });
  EXPECT_NE(e.find("'x.bin' is listed by more than one writer"), std::string::npos) << e;
}

// Bad arguments are td::Errors that say what is wrong.
TEST_F(Checkpoint, BadInput) {
  ck::CheckpointWriter w(path("ck"));
  for (const char* bad : {"a/b", ".hidden", "meta.json", "MANIFEST.0.json", ""})
    EXPECT_NE(error_of([&] { w.write_bytes(bad, "x"); }).find("bad file name"), std::string::npos)
        << bad;
  w.write_bytes("x", "1");
  EXPECT_NE(error_of([&] { w.write_bytes("x", "2"); }).find("already written"), std::string::npos);
  EXPECT_NE(error_of([&] { w.copy_file("y", path("missing")); }).find("cannot open"),
            std::string::npos);
  td::json::Value meta = td::json::Object{};
  meta.set("version", 3);
  EXPECT_NE(error_of([&] { w.commit(meta); }).find("'version' is reserved"), std::string::npos);
  EXPECT_NE(error_of([&] { w.commit(td::json::Value(3)); }).find("JSON object"), std::string::npos);
  w.commit();
  EXPECT_NE(error_of([&] { w.commit(); }).find("already"), std::string::npos);
  EXPECT_THROW(ck::CheckpointWriter(path("z"), -1), td::Error);

  // Readers: no directory, an unfinished one, a foreign meta.json, a newer version.
  EXPECT_NE(error_of([&] { ck::CheckpointReader r(path("none")); }).find("not a complete"),
            std::string::npos);
  { ck::CheckpointWriter unfinished(path("u")); }
  EXPECT_NE(error_of([&] { ck::CheckpointReader r(path("u")); }).find("unfinished save"),
            std::string::npos);
  fs::create_directories(path("foreign"));
  td::test::write_bytes(path("foreign/meta.json"), "{\"format\": \"other\"}");
  EXPECT_NE(error_of([&] { ck::CheckpointReader r(path("foreign")); }).find("format"),
            std::string::npos);
  std::string m = td::test::read_bytes(path("ck/meta.json"));
  m.replace(m.find("\"version\": 1"), 12, "\"version\": 2");
  td::test::write_bytes(path("ck/meta.json"), m);
  EXPECT_NE(error_of([&] { ck::CheckpointReader r(path("ck")); }).find("version 2"),
            std::string::npos);
  EXPECT_THROW(ck::step_dir_name(-1), td::Error);
  EXPECT_THROW(ck::update_latest(dir().string(), "a/b"), td::Error);
}

// Saving the same directory again replaces it completely (no .old or .tmp left).
TEST_F(Checkpoint, Overwrite) {
  save(path("step_00000001"), 1.0f);
  save(path("step_00000001"), 2.0f);
  EXPECT_EQ(value_of(path("step_00000001")), 2.0f);
  EXPECT_FALSE(fs::exists(path("step_00000001.old")));
  EXPECT_FALSE(fs::exists(path("step_00000001.tmp")));
}

// step_dir_name's format; find_latest follows `latest`, else the highest complete step, and
// ignores .tmp and incomplete directories; a lone .old is used (the recovery rule); when both
// DIR and DIR.old exist, DIR wins.
TEST_F(Checkpoint, FindLatest) {
  EXPECT_EQ(ck::step_dir_name(100), "step_00000100");
  EXPECT_EQ(ck::step_dir_name(123456789), "step_123456789");
  EXPECT_FALSE(ck::find_latest(path("nothing")).has_value());
  EXPECT_FALSE(ck::find_latest(dir().string()).has_value());
  save(path("step_00000010"), 10.f, false);
  save(path("step_00000020"), 20.f, false);
  fs::create_directories(path("step_00000030"));      // incomplete (no meta.json)
  { ck::CheckpointWriter w(path("step_00000040")); }  // a .tmp only
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000020"));
  ck::update_latest(dir().string(), "step_00000010");
  EXPECT_EQ(td::test::read_bytes(path("latest")), "step_00000010\n");
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000010"));
  ck::update_latest(dir().string(), "step_00000030");  // incomplete: fall back to the scan
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000020"));
  fs::rename(path("step_00000020"), path("step_00000020.old"));
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000020.old"));
  EXPECT_EQ(value_of(path("step_00000020")), 20.f);  // the reader applies the rule too
  save(path("step_00000020"), 21.f, false);          // deletes the .old
  EXPECT_FALSE(fs::exists(path("step_00000020.old")));
  fs::copy(path("step_00000020"), path("step_00000020.old"));
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000020"));
}

// Runs `save` in a forked child with TD_CHECKPOINT_CRASH_AT=point; returns the exit status.
template <typename F>
int run_crashing(const char* point, F&& save) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("TD_CHECKPOINT_CRASH_AT", point, 1);
    try {
      save();
    } catch (...) {
      std::_Exit(1);
    }
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A crash at each point of adding step 2 next to step 1: the crash happens (exit 42), and
// find_latest still gives step 1, intact; the next save of step 2 succeeds and wins.
TEST_F(Checkpoint, CrashWhileAddingKeepsPrevious) {
  save(path("step_00000001"), 1.f);
  Tensor t = td::full({4, 3}, 2.f);
  for (const char* point : {"after_tensors", "before_rename"}) {
    EXPECT_EQ(run_crashing(point,
                           [&] {
                             ck::CheckpointWriter w(path("step_00000002"));
                             w.write_tensors("model.safetensors", {{"w", t}});
                             w.commit();
                             ck::update_latest(dir().string(), "step_00000002");
                           }),
              42)
        << point;
    EXPECT_TRUE(fs::exists(path("step_00000002.tmp"))) << point;
    EXPECT_FALSE(fs::exists(path("step_00000002"))) << point;
    auto latest = ck::find_latest(dir().string());
    ASSERT_TRUE(latest.has_value()) << point;
    EXPECT_EQ(*latest, path("step_00000001")) << point;
    EXPECT_EQ(value_of(*latest), 1.f) << point;
  }
  // Without `latest`, the scan also ignores the .tmp (it has a meta.json after before_rename).
  fs::remove(path("latest"));
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000001"));
  save(path("step_00000002"), 2.f);
  EXPECT_EQ(ck::find_latest(dir().string()), path("step_00000002"));
  EXPECT_EQ(value_of(path("step_00000002")), 2.f);
}

// A crash at each point of OVERWRITING step 1: before the commit point the old step 1 is what
// find_latest gives; after the rename aside (the old one is step_1.old, the new one still .tmp)
// the old one is still found through the recovery rule; never a damaged directory. A later save
// of the same step cleans everything up.
TEST_F(Checkpoint, CrashWhileOverwritingKeepsPrevious) {
  save(path("step_00000001"), 1.f);
  Tensor t = td::full({4, 3}, 5.f);
  for (const char* point : {"after_tensors", "before_rename", "after_rename_aside"}) {
    EXPECT_EQ(run_crashing(point,
                           [&] {
                             ck::CheckpointWriter w(path("step_00000001"));
                             w.write_tensors("model.safetensors", {{"w", t}});
                             w.commit();
                           }),
              42)
        << point;
    auto latest = ck::find_latest(dir().string());
    ASSERT_TRUE(latest.has_value()) << point;
    EXPECT_EQ(value_of(*latest), 1.f) << point;
    EXPECT_EQ(value_of(path("step_00000001")), 1.f) << point;
    if (std::string(point) == "after_rename_aside") {
      EXPECT_EQ(*latest, path("step_00000001.old"));
      EXPECT_FALSE(fs::exists(path("step_00000001")));
    }
  }
  // From that state (step_1 missing, step_1.old complete), a save that does not crash puts the
  // new checkpoint in place and removes the .old and .tmp.
  EXPECT_EQ(run_crashing("none", [&] { save(path("step_00000001"), 7.f); }), 0);
  EXPECT_EQ(value_of(*ck::find_latest(dir().string())), 7.f);
  EXPECT_FALSE(fs::exists(path("step_00000001.old")));
  EXPECT_FALSE(fs::exists(path("step_00000001.tmp")));
}

}  // namespace
