// Safetensors read/write: round trips for every dtype, byte compatibility with the reference
// writer (Python `safetensors`), and every corruption as a td::Error naming file and tensor.
#include "tardelli/checkpoint/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tardelli/ops/factory.h"

namespace {

namespace fs = std::filesystem;
using td::DType;
using td::Tensor;
using td::checkpoint::load_safetensors;
using td::checkpoint::NamedTensors;
using td::checkpoint::save_safetensors;

class Safetensors : public td::test::TempDirTest {};

using td::test::read_bytes;
using td::test::same_bytes;
using td::test::write_bytes;
std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}
// A file with the given JSON header (padded like the reference) and data bytes.
std::string make_file(const std::string& header, const std::string& data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
  return out + h + data;
}
// The td::Error text of load_safetensors(p) ("" when it loads).
std::string load_error(const std::string& p) {
  try {
    load_safetensors(p);
  } catch (const td::Error& e) {
    return e.what();
  }
  return "";
}

// Property: every dtype (and scalar, empty and non-contiguous inputs) survives write -> read
// bit for bit, with metadata; output is deterministic, the data starts 8-aligned, no temp file
// remains, and tensors come back 64-byte aligned and contiguous.
TEST_F(Safetensors, RoundTripAllDTypes) {
  td::Generator gen(5);
  Tensor base = td::randn({5, 7}, {}, &gen);
  NamedTensors in = {
      {"w.f32", td::randn({3, 4}, {}, &gen)},
      {"w.bf16", td::randn({4, 3}, {DType::BFloat16}, &gen)},
      {"w.f16", td::randn({2, 2, 2}, {DType::Float16}, &gen)},
      {"i.i32", td::randint(-1000, 1000, {6}, {DType::Int32}, &gen)},
      {"i.i64", td::randint(-(int64_t{1} << 40), int64_t{1} << 40, {2, 3}, {DType::Int64}, &gen)},
      {"m.bool", td::randint(0, 2, {9}, {DType::Int64}, &gen).to(DType::Bool)},
      {"scalar", td::scalar_tensor(3.5)},
      {"empty", td::zeros({0, 4})},
      {"transposed", base.t()},            // non-contiguous
      {"sliced", base.slice(1, 1, 7, 2)},  // non-contiguous, offset
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "\"quoted\"\n"}};
  save_safetensors(path("a.safetensors"), in, meta);
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp")));
  auto f = load_safetensors(path("a.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    const Tensor& back = f.at(name);
    EXPECT_TRUE(same_bytes(t, back)) << name;
    EXPECT_TRUE(back.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(back.data_ptr()) % td::kCpuAlignment, 0u) << name;
  }
  // Determinism (input order does not matter) and the reference layout rules.
  NamedTensors reversed(in.rbegin(), in.rend());
  save_safetensors(path("b.safetensors"), reversed, meta);
  const std::string a = read_bytes(path("a.safetensors")), b = read_bytes(path("b.safetensors"));
  EXPECT_EQ(a, b);
  uint64_t n = 0;
  std::memcpy(&n, a.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  // Overwriting an existing file replaces it.
  save_safetensors(path("a.safetensors"), {{"only", td::ones({2})}});
  EXPECT_EQ(load_safetensors(path("a.safetensors")).tensors.size(), 1u);
}

// A file written by the Python `safetensors` package (0.8.0, safetensors.torch.save_file with
// metadata={"format": "pt"}) from these torch tensors:
//   b.f32 [[1.5,-2,3.25],[0,1e-3,-7]] f32   a.bf16 [1,-0.5,3] bf16   c.f16 [[0.25],[-8]] f16
//   d.i32 [7,-1]   e.i64 [[1,2],[3,-4]]   f.bool [T,F,T]   g.scalar 2.0 (shape [])
//   h.empty zeros(0,3) f32
const char* kPythonFixtureHex =
    "08020000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c22652e6936"
    "34223a7b226474797065223a22493634222c227368617065223a5b322c325d2c22646174615f6f666673657473"
    "223a5b302c33325d7d2c22622e663332223a7b226474797065223a22463332222c227368617065223a5b322c33"
    "5d2c22646174615f6f666673657473223a5b33322c35365d7d2c22672e7363616c6172223a7b22647479706522"
    "3a22463332222c227368617065223a5b5d2c22646174615f6f666673657473223a5b35362c36305d7d2c22682e"
    "656d707479223a7b226474797065223a22463332222c227368617065223a5b302c335d2c22646174615f6f6666"
    "73657473223a5b36302c36305d7d2c22642e693332223a7b226474797065223a22493332222c22736861706522"
    "3a5b325d2c22646174615f6f666673657473223a5b36302c36385d7d2c22612e62663136223a7b226474797065"
    "223a2242463136222c227368617065223a5b335d2c22646174615f6f666673657473223a5b36382c37345d7d2c"
    "22632e663136223a7b226474797065223a22463136222c227368617065223a5b322c315d2c22646174615f6f66"
    "6673657473223a5b37342c37385d7d2c22662e626f6f6c223a7b226474797065223a22424f4f4c222c22736861"
    "7065223a5b335d2c22646174615f6f666673657473223a5b37382c38315d7d7d20010000000000000002000000"
    "000000000300000000000000fcffffffffffffff0000c03f000000c000005040000000006f12833a0000e0c000"
    "00004007000000ffffffff803f00bf4040003400c8010001";

// Property: we read the reference writer's file with the right values, and our writer
// reproduces it byte for byte from the same tensors and metadata.
TEST_F(Safetensors, ReadsAndReproducesReferenceFile) {
  const std::string ref = from_hex(kPythonFixtureHex);
  write_bytes(path("py.safetensors"), ref);
  auto f = load_safetensors(path("py.safetensors"));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(td::to_vector<float>(f.at("b.f32")),
            (std::vector<float>{1.5f, -2.f, 3.25f, 0.f, 1e-3f, -7.f}));
  EXPECT_EQ(f.at("b.f32").sizes(), (td::Shape{2, 3}));
  EXPECT_EQ(f.at("a.bf16").dtype(), DType::BFloat16);
  EXPECT_EQ(td::to_vector<float>(f.at("a.bf16")), (std::vector<float>{1.f, -0.5f, 3.f}));
  EXPECT_EQ(td::to_vector<float>(f.at("c.f16")), (std::vector<float>{0.25f, -8.f}));
  EXPECT_EQ(td::to_vector<int32_t>(f.at("d.i32")), (std::vector<int32_t>{7, -1}));
  EXPECT_EQ(td::to_vector<int64_t>(f.at("e.i64")), (std::vector<int64_t>{1, 2, 3, -4}));
  EXPECT_EQ(f.at("f.bool").dtype(), DType::Bool);
  EXPECT_EQ(td::to_vector<int64_t>(f.at("f.bool").to(DType::Int64)),
            (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f.at("g.scalar").dim(), 0);
  EXPECT_EQ(f.at("g.scalar").item<float>(), 2.f);
  EXPECT_EQ(f.at("h.empty").sizes(), (td::Shape{0, 3}));
  EXPECT_THROW(f.at("nope"), td::Error);

  save_safetensors(path("ours.safetensors"), f.tensors, f.metadata);
  EXPECT_EQ(read_bytes(path("ours.safetensors")), ref);
}

// A file written by the Python `safetensors` package (0.8.0; serialize() with TensorSpecs of
// dtype "float8_e4m3fn" / "float8_e5m2" over raw bytes, since the Debian torch has no float8;
// metadata {"format": "pt"}):
//   h  F16 [1, -2]      e4 F8_E4M3 [2, 4] codes 38 b8 7e fe 7f 01 08 80
//   m  BOOL [T, F]      e5 F8_E5M2 [8]    codes 3c bc 7b fb 7c 01 7f 80
const char* kPythonFp8FixtureHex =
    "08010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c2268223a7b"
    "226474797065223a22463136222c227368617065223a5b325d2c22646174615f6f666673657473223a5b302c34"
    "5d7d2c226534223a7b226474797065223a2246385f45344d33222c227368617065223a5b322c345d2c22646174"
    "615f6f666673657473223a5b342c31325d7d2c226535223a7b226474797065223a2246385f45354d32222c2273"
    "68617065223a5b385d2c22646174615f6f666673657473223a5b31322c32305d7d2c226d223a7b226474797065"
    "223a22424f4f4c222c227368617065223a5b325d2c22646174615f6f666673657473223a5b32302c32325d7d7d"
    "2020003c00c038b87efe7f0108803cbc7bfb7c017f800100";

std::vector<uint8_t> codes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel());
}

// Property: F8_E4M3 / F8_E5M2 tensors load as float8_e4m3fn / float8_e5m2 with the file's bytes
// and values (OCP E4M3FN and E5M2: 1, -1, +-max, NaN, the smallest subnormal, the smallest
// normal, -0, inf), and our writer reproduces the reference writer's file byte for byte
// (including where F8 sorts among the dtypes: after F16, E4M3 before E5M2, before BOOL).
TEST_F(Safetensors, Fp8ReadsAndReproducesReferenceFile) {
  const std::string ref = from_hex(kPythonFp8FixtureHex);
  write_bytes(path("py8.safetensors"), ref);
  auto f = load_safetensors(path("py8.safetensors"));
  const Tensor& e4 = f.at("e4");
  const Tensor& e5 = f.at("e5");
  EXPECT_EQ(e4.dtype(), DType::Float8E4M3FN);
  EXPECT_EQ(e5.dtype(), DType::Float8E5M2);
  EXPECT_EQ(e4.sizes(), (td::Shape{2, 4}));
  EXPECT_EQ(codes_of(e4), (std::vector<uint8_t>{0x38, 0xB8, 0x7E, 0xFE, 0x7F, 0x01, 0x08, 0x80}));
  EXPECT_EQ(codes_of(e5), (std::vector<uint8_t>{0x3C, 0xBC, 0x7B, 0xFB, 0x7C, 0x01, 0x7F, 0x80}));
  const std::vector<float> v4 = td::to_vector<float>(e4.to(DType::Float32));
  const std::vector<float> v5 = td::to_vector<float>(e5.to(DType::Float32));
  const std::vector<float> want4 = {1.f, -1.f, 448.f, -448.f, NAN, 0x1p-9f, 0x1p-6f, -0.f};
  const std::vector<float> want5 = {1.f, -1.f, 57344.f, -57344.f, INFINITY, 0x1p-16f, NAN, -0.f};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(std::isnan(v4[i]), std::isnan(want4[i])) << i;
    if (!std::isnan(want4[i])) {
      EXPECT_EQ(v4[i], want4[i]) << i;
    }
    EXPECT_EQ(std::isnan(v5[i]), std::isnan(want5[i])) << i;
    if (!std::isnan(want5[i])) {
      EXPECT_EQ(v5[i], want5[i]) << i;
    }
  }
  EXPECT_TRUE(std::signbit(v4[7]) && std::signbit(v5[7]));
  save_safetensors(path("ours8.safetensors"), f.tensors, f.metadata);
  EXPECT_EQ(read_bytes(path("ours8.safetensors")), ref);
}

// Property: every one of the 256 codes of both FP8 dtypes survives save -> load bit for bit,
// from contiguous and strided tensors; a hand-assembled file (8-byte length, JSON, bytes) with
// F8 entries loads with exactly its bytes; a byte count that does not match an F8 shape (1 byte
// per element) is the usual clear error.
TEST_F(Safetensors, Fp8RoundTripAndHandWrittenFile) {
  for (DType dt : {DType::Float8E4M3FN, DType::Float8E5M2}) {
    Tensor all = Tensor::empty({16, 16}, dt);
    auto* p = static_cast<uint8_t*>(all.data_ptr());
    for (int c = 0; c < 256; ++c) p[c] = static_cast<uint8_t>(c);
    save_safetensors(path("f8.safetensors"), {{"all", all}, {"t", all.t()}});
    auto f = load_safetensors(path("f8.safetensors"));
    EXPECT_EQ(f.at("all").dtype(), dt);
    EXPECT_TRUE(same_bytes(all, f.at("all"))) << td::dtype_name(dt);
    EXPECT_TRUE(same_bytes(all.t(), f.at("t"))) << td::dtype_name(dt);
  }
  // e4m3fn 2.0 = 0.1000.000 = 0x40, -0.5 = 1.0110.000 = 0xB0; e5m2 3.0 = 0.10000.10 = 0x42
  std::string data = "\x40\xB0";
  data += '\x42';
  write_bytes(path("hand.safetensors"),
              make_file(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},)"
                        R"("b":{"dtype":"F8_E5M2","shape":[1,1],"data_offsets":[2,3]}})",
                        data));
  auto f = load_safetensors(path("hand.safetensors"));
  EXPECT_EQ(f.at("a").dtype(), DType::Float8E4M3FN);
  EXPECT_EQ(td::to_vector<float>(f.at("a").to(DType::Float32)), (std::vector<float>{2.f, -0.5f}));
  EXPECT_EQ(f.at("b").dtype(), DType::Float8E5M2);
  EXPECT_EQ(f.at("b").sizes(), (td::Shape{1, 1}));
  EXPECT_EQ(f.at("b").item<float>(), 3.f);
  write_bytes(path("bad8.safetensors"),
              make_file(R"({"a":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[0,2]}})", "\1\2"));
  const std::string err = load_error(path("bad8.safetensors"));
  EXPECT_NE(err.find("tensor 'a': dtype F8_E5M2 and shape [3] need 3 bytes"), std::string::npos)
      << err;
}

// Property: each way a file can be short, inconsistent or malformed is a td::Error whose text
// names the file, the tensor involved (where there is one) and the problem; nothing crashes.
TEST_F(Safetensors, CorruptFilesAreClearErrors) {
  const std::string p = path("bad.safetensors");
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\1');
  struct Case {
    std::string bytes;
    std::vector<std::string> expect;  // substrings of the error besides the path
  };
  std::string long_len(8, '\0');
  long_len[0] = 100;  // header length 100 in a 10-byte file
  const std::vector<Case> cases = {
      {"", {"shorter than the 8-byte header length"}},
      {std::string("\x10\0\0\0\0\0\0", 7), {"file is 7 bytes"}},
      {long_len + "{}", {"header length 100 runs past the end of the file (10 bytes)"}},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8) + "{}", {"runs past the end"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8) + "junk",
       {"trailing bytes"}},
      {make_file(R"({"x":{"dtype":"F32",)", data8), {"malformed header", "JSON:", "at byte"}},
      {make_file("[]", ""), {"header must be a JSON object"}},
      {make_file("{" + ok_entry + "," + ok_entry + "}", data8),
       {"malformed header", "duplicate key \"x\""}},
      {make_file(R"({"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "unknown dtype \"F33\""}},
      {make_file(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "dtype F64 is not supported"}},
      {make_file(R"({"x":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "dtype F8_E8M0 is not supported", "F8_E4M3, F8_E5M2"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "need 12 bytes but data_offsets [0, 8) hold 8"}},
      {make_file(R"({"x":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "need 4 bytes"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 data8),
       {"tensor 'y'", "overlap tensor 'x'"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
       {"tensor 'x'", "leave a gap: bytes [0, 4)"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8),
       {"tensor 'x'", "run past the data section (8 bytes)", "truncated"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8),
       {"tensor 'x'", "end before begin"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", data8),
       {"tensor 'x'", "data_offsets must be [begin, end]"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8),
       {"tensor 'x'", "data_offsets must be [begin, end]"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "shape must hold non-negative integers"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       {"tensor 'x'", "shape must hold non-negative integers"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4],)"
                 R"("data_offsets":[0,8]}})",
                 data8),
       {"tensor 'x'", "overflows"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2]}})", data8),
       {"tensor 'x'", "needs dtype, shape and data_offsets"}},
      {make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", data8),
       {"tensor 'x'", "unexpected header field \"extra\""}},
      {make_file(R"({"x":[1]})", data8), {"tensor 'x'", "must be an object"}},
      {make_file(R"({"__metadata__":{"a":1},)" + ok_entry + "}", data8),
       {"__metadata__ value of \"a\" must be a string"}},
      {make_file(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\1\2"),
       {"tensor 'b'", "BOOL element 1 holds byte 2"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    write_bytes(p, cases[i].bytes);
    std::string err = load_error(p);
    EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << "case " << i << ": " << err;
    for (const auto& s : cases[i].expect)
      EXPECT_NE(err.find(s), std::string::npos)
          << "case " << i << ": error\n  " << err << "\nshould contain\n  " << s;
  }
  // A missing file and a directory.
  EXPECT_NE(load_error(path("missing.safetensors")).find("cannot open"), std::string::npos);
  EXPECT_NE(load_error(dir().string()).find("not a regular file"), std::string::npos);
}

// Property: a valid file truncated at every length, or with random bytes flipped, loads or
// raises td::Error, never crashes or throws anything else; truncations always fail.
TEST_F(Safetensors, TruncationsAndMutationsNeverCrash) {
  NamedTensors in = {{"a", td::randn({3, 5})},
                     {"b", td::randint(0, 9, {4}, {DType::Int32})},
                     {"c", td::ones({2}, {DType::Bool})}};
  save_safetensors(path("ok.safetensors"), in, {{"format", "pt"}});
  const std::string good = read_bytes(path("ok.safetensors"));
  const std::string p = path("mut.safetensors");
  for (size_t len = 0; len < good.size(); ++len) {
    write_bytes(p, good.substr(0, len));
    EXPECT_THROW(load_safetensors(p), td::Error) << "truncated to " << len;
  }
  std::mt19937 rng(99);
  int loaded = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string b = good;
    int n = 1 + static_cast<int>(rng() % 3);
    // Mostly hit the 8-byte length and the header, where the interesting parsing is.
    for (int k = 0; k < n; ++k) {
      size_t pos = rng() % 4 ? rng() % std::min<size_t>(b.size(), 200) : rng() % b.size();
      b[pos] = static_cast<char>(rng() % 256);
    }
    write_bytes(p, b);
    try {
      load_safetensors(p);
      ++loaded;
    } catch (const td::Error&) {
    }
  }
  EXPECT_GT(loaded, 0);  // some mutations only touch tensor bytes or padding
}

// Property: bad arguments to the writer are td::Errors and leave neither the file nor the
// temporary behind.
TEST_F(Safetensors, WriterRejectsBadInput) {
  const std::string p = path("w.safetensors");
  auto expect_error = [&](const NamedTensors& ts, const std::string& what) {
    try {
      save_safetensors(p, ts);
      ADD_FAILURE() << "expected an error containing " << what;
    } catch (const td::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  };
  expect_error({{"a", td::ones({1})}, {"a", td::ones({1}, {DType::Int64})}},
               "duplicate tensor name 'a'");
  expect_error({{"", td::ones({1})}}, "non-empty");
  expect_error({{"__metadata__", td::ones({1})}}, "reserved");
  expect_error({{"u", Tensor()}}, "tensor 'u' is undefined");
  try {
    save_safetensors(path("no/such/dir/x.safetensors"), {{"a", td::ones({1})}});
    ADD_FAILURE() << "expected an error";
  } catch (const td::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
  }
}

}  // namespace
