#pragma once
// Helpers shared by the C++ test suites (internal to tests/): temporary directories, file bytes,
// error messages, and tensors compared against double-precision references.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::test {

// A fresh directory named after the process, the running test and a per-process counter (so
// parallel ctest processes and several TempDirs in one test never collide), removed with
// everything in it when the TempDir is destroyed.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "td_test_" + std::to_string(::getpid()) + "_" +
                       std::to_string(counter.fetch_add(1)) + "_" +
                       (info ? std::string(info->test_suite_name()) + "_" + info->name() : "none");
    for (char& c : name)
      if (c == '/') c = '_';  // parameterized tests are named "Prefix/Suite.Test/0"
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor; a leftover temp dir is harmless
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // `name` inside the directory (a file, a subdirectory or a file-name prefix).
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// A fixture giving each test a fresh TempDir: path(name) is a path inside it, dir() the directory.
class TempDirTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.path(name); }
  const std::filesystem::path& dir() const { return tmp_.dir(); }

 private:
  TempDir tmp_;  // created with the fixture (the test is already current), removed after TearDown
};

// A whole file as bytes: std::string by default, or another container of single bytes
// (std::vector<unsigned char>). Empty when the file cannot be read.
template <typename Bytes = std::string>
Bytes read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& p, const std::string& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

inline void write_bytes(const std::string& p, const std::vector<unsigned char>& b) {
  write_bytes(p, std::string(b.begin(), b.end()));
}

// The message of the td::Error that f throws ("" when it throws nothing, which fails any check
// that the message contains something).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const td::Error& e) {
    return e.what();
  }
  return "";
}

// Sets (or with nullptr unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Same dtype, sizes and bytes (any layout).
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return ca.dtype() == cb.dtype() && ca.sizes() == cb.sizes() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// The logical values of t (any dtype and layout, through float) as doubles, for references.
inline std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> f = to_vector<float>(t);
  return std::vector<double>(f.begin(), f.end());
}

// |got[i] - want[i]| <= atol + rtol * |want[i]| for every i (stops at the first failure).
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double atol, double rtol, const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " element " << i;
  }
}

// Standard normal float32 values from a generator seeded with `seed`, times scale plus shift
// (each applied only when it changes something, so the defaults give randn's exact values).
inline Tensor randn_seeded(const Shape& s, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  Tensor t = randn(s, {}, &gen);
  if (scale != 1.0) t = mul(t, scale);
  if (shift != 0.0) t = add(t, shift);
  return t;
}

// randn_seeded(s, seed) converted to dtype dt.
inline Tensor randn_seeded(const Shape& s, uint64_t seed, DType dt) {
  Tensor t = randn_seeded(s, seed);
  return dt == DType::Float32 ? t : t.to(dt);
}

// randn_seeded(s, seed) as a leaf that requires grad.
inline Tensor leaf(const Shape& s, uint64_t seed) {
  Tensor t = randn_seeded(s, seed);
  t.set_requires_grad(true);
  return t;
}

// Sets the OpenMP thread count for a scope, restoring the previous count on exit.
struct ThreadCount {
  explicit ThreadCount(int n) : prev(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(prev); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
  int prev;
};

}  // namespace td::test
