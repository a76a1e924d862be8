// Megatron-compatible indexed dataset: a validating mmap reader and an atomic writer.
#include "tardelli/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tardelli/core/error.h"

namespace td::data {

static_assert(std::endian::native == std::endian::little,
              "the Megatron index format is little-endian; a big-endian host needs byte swaps");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, counts: 34

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Integer range of a token dtype code (for the builder's overflow check).
void code_range(uint8_t code, int64_t& lo, int64_t& hi) {
  switch (code) {
    case kDTypeUInt8:
      lo = 0, hi = 255;
      return;
    case kDTypeInt8:
      lo = -128, hi = 127;
      return;
    case kDTypeInt16:
      lo = -32768, hi = 32767;
      return;
    case kDTypeInt32:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      return;
    case kDTypeInt64:
      lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
      return;
    case kDTypeUInt16:
      lo = 0, hi = 65535;
      return;
    default:
      TD_ERROR("IndexedDatasetBuilder: dtype code ", int(code), " (", dtype_code_name(code),
               ") is not an integer token dtype");
  }
}

// Typed dispatch over the integer token dtypes.
template <typename F>
void dispatch_int_code(uint8_t code, const char* what, F&& f) {
  switch (code) {
    case kDTypeUInt8:
      return f.template operator()<uint8_t>();
    case kDTypeInt8:
      return f.template operator()<int8_t>();
    case kDTypeInt16:
      return f.template operator()<int16_t>();
    case kDTypeInt32:
      return f.template operator()<int32_t>();
    case kDTypeInt64:
      return f.template operator()<int64_t>();
    case kDTypeUInt16:
      return f.template operator()<uint16_t>();
    default:
      TD_ERROR(what, ": token dtype ", dtype_code_name(code), " (code ", int(code),
               ") is not an integer dtype; token datasets hold uint8, int8, int16, int32, int64 "
               "or uint16");
  }
}

std::string errno_text() {
  return std::strerror(errno);
}

// Maps a whole file read-only; returns its size. An empty file maps to nullptr.
void* map_file(const std::string& path, size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TD_CHECK(fd >= 0, "IndexedDataset: cannot open ", path, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    TD_ERROR("IndexedDataset: cannot stat ", path, ": ", e);
  }
  size = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (size > 0) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string e = errno_text();
      ::close(fd);
      TD_ERROR("IndexedDataset: cannot mmap ", path, " (", size, " bytes): ", e);
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  return p;
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

size_t dtype_code_size(uint8_t code) {
  switch (code) {
    case kDTypeUInt8:
    case kDTypeInt8:
      return 1;
    case kDTypeInt16:
    case kDTypeUInt16:
      return 2;
    case kDTypeInt32:
    case kDTypeFloat32:
      return 4;
    case kDTypeInt64:
    case kDTypeFloat64:
      return 8;
    default:
      TD_ERROR("indexed dataset: unknown dtype code ", int(code), " (valid codes are 1..8)");
  }
}

const char* dtype_code_name(uint8_t code) {
  switch (code) {
    case kDTypeUInt8:
      return "uint8";
    case kDTypeInt8:
      return "int8";
    case kDTypeInt16:
      return "int16";
    case kDTypeInt32:
      return "int32";
    case kDTypeInt64:
      return "int64";
    case kDTypeFloat64:
      return "float64";
    case kDTypeFloat32:
      return "float32";
    case kDTypeUInt16:
      return "uint16";
    default:
      return "unknown";
  }
}

bool is_integer_dtype_code(uint8_t code) {
  return code >= kDTypeUInt8 && code <= kDTypeUInt16 && code != kDTypeFloat32 &&
         code != kDTypeFloat64;
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  idx_map_ = map_file(idx_path_, idx_size_);
  try {
    bin_map_ = map_file(bin_path_, bin_size_);
    validate(idx_size_, bin_size_);
  } catch (...) {
    if (idx_map_) ::munmap(idx_map_, idx_size_);
    if (bin_map_) ::munmap(bin_map_, bin_size_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_size_);
  if (bin_map_) ::munmap(bin_map_, bin_size_);
}

// Note [Unaligned index]: the arrays of the .idx start right after the 34-byte header, so the
// int32 lengths and int64 pointers are misaligned for their types. Reading them through a
// typed pointer would be undefined behaviour; memcpy of a fixed size compiles to a plain load.
int64_t IndexedDataset::length_at(int64_t i) const {
  return load<int32_t>(lengths_ + 4 * i);
}
int64_t IndexedDataset::pointer_at(int64_t i) const {
  return load<int64_t>(pointers_ + 8 * i);
}
int64_t IndexedDataset::doc_idx_at(int64_t k) const {
  return load<int64_t>(doc_idx_ + 8 * k);
}

// Note [Validate before trusting]: a training run reads this file for days; a truncated copy or
// a file from another tool must fail at open with a message that says what is wrong, not
// segfault (pointer past the mapping) or silently train on garbage in the middle of a run.
void IndexedDataset::validate(size_t idx_bytes, size_t bin_bytes) {
  const std::string& ip = idx_path_;
  const std::string bn = base_name(bin_path_);
  const auto* base = static_cast<const unsigned char*>(idx_map_);
  TD_CHECK(idx_bytes >= kHeaderBytes, "IndexedDataset: ", ip, ": the file has ", idx_bytes,
           " bytes, fewer than the ", kHeaderBytes, "-byte header (truncated .idx?)");
  TD_CHECK(std::memcmp(base, kMagic, 9) == 0, "IndexedDataset: ", ip,
           ": bad magic (expected \"MMIDIDX\\0\\0\"; not a Megatron mmap index file)");
  const uint64_t version = load<uint64_t>(base + 9);
  TD_CHECK(version == 1, "IndexedDataset: ", ip, ": unsupported index version ", version,
           " (expected 1)");
  dtype_code_ = base[17];
  TD_CHECK(dtype_code_ >= 1 && dtype_code_ <= 8, "IndexedDataset: ", ip, ": bad dtype code ",
           int(dtype_code_), " (Megatron's codes are 1..8)");
  itemsize_ = dtype_code_size(dtype_code_);
  const uint64_t sc = load<uint64_t>(base + 18);
  const uint64_t dc = load<uint64_t>(base + 26);
  // Bound the counts by the file size before multiplying, so the size arithmetic cannot wrap.
  const uint64_t body = idx_bytes - kHeaderBytes;
  const bool fits = sc <= body / 12 && dc <= body / 8 && sc * 12 + dc * 8 <= body;
  const uint64_t need = fits ? kHeaderBytes + sc * 12 + dc * 8 : 0;
  TD_CHECK(fits && (idx_bytes == need || idx_bytes == need + sc), "IndexedDataset: ", ip,
           ": the header says ", sc, " sequences and ", dc, " document indices, which need ",
           kHeaderBytes, " + 12*", sc, " + 8*", dc, " bytes (",
           (fits ? std::to_string(need) : "more"), "), but the file has ", idx_bytes,
           " bytes (truncated .idx?)");
  TD_CHECK(dc >= 1, "IndexedDataset: ", ip,
           ": document_indices is empty (it must start with 0 and end with the sequence count)");
  sequence_count_ = static_cast<int64_t>(sc);
  document_count_ = static_cast<int64_t>(dc);
  lengths_ = base + kHeaderBytes;
  pointers_ = lengths_ + 4 * sc;
  doc_idx_ = pointers_ + 8 * sc;

  int64_t expect = 0;  // the byte where the next sequence must start
  num_tokens_ = 0;
  const int64_t isz = static_cast<int64_t>(itemsize_);
  const int64_t bin_sz = static_cast<int64_t>(bin_bytes);
  for (int64_t i = 0; i < sequence_count_; ++i) {
    const int64_t len = length_at(i), ptr = pointer_at(i);
    TD_CHECK(len >= 0, "IndexedDataset: ", ip, ": sequence ", i, " has negative length ", len);
    TD_CHECK(ptr == expect, "IndexedDataset: ", ip, ": sequence ", i, " starts at byte ", ptr,
             " but the sequences before it end at byte ", expect,
             " (pointers inconsistent with lengths and the ", dtype_code_name(dtype_code_),
             " item size)");
    const int64_t end = ptr + len * isz;
    TD_CHECK(end <= bin_sz, "IndexedDataset: ", ip, ": sequence ", i, " ends at byte ", end,
             " but ", bn, " has ", bin_sz, " bytes (truncated .bin?)");
    expect = end;
    num_tokens_ += len;
  }
  TD_CHECK(expect == bin_sz, "IndexedDataset: ", ip, ": the sequences end at byte ", expect,
           " but ", bn, " has ", bin_sz, " bytes (trailing bytes: .bin and .idx do not match)");
  TD_CHECK(doc_idx_at(0) == 0, "IndexedDataset: ", ip, ": document_indices[0] is ", doc_idx_at(0),
           " (expected 0)");
  for (int64_t k = 1; k < document_count_; ++k) {
    TD_CHECK(doc_idx_at(k) >= doc_idx_at(k - 1), "IndexedDataset: ", ip, ": document_indices[", k,
             "] = ", doc_idx_at(k), " is smaller than document_indices[", k - 1,
             "] = ", doc_idx_at(k - 1), " (must be non-decreasing)");
  }
  TD_CHECK(doc_idx_at(document_count_ - 1) == sequence_count_, "IndexedDataset: ", ip,
           ": the last document index is ", doc_idx_at(document_count_ - 1), " but there are ",
           sequence_count_, " sequences (they must match)");
}

int64_t IndexedDataset::sequence_length(int64_t seq) const {
  TD_CHECK(seq >= 0 && seq < sequence_count_, "IndexedDataset::sequence_length: sequence ", seq,
           " out of range [0, ", sequence_count_, ") of ", prefix_);
  return length_at(seq);
}

int64_t IndexedDataset::document_first(int64_t doc) const {
  TD_CHECK(doc >= 0 && doc < num_documents(), "IndexedDataset: document ", doc,
           " out of range [0, ", num_documents(), ") of ", prefix_);
  return doc_idx_at(doc);
}

int64_t IndexedDataset::document_end(int64_t doc) const {
  TD_CHECK(doc >= 0 && doc < num_documents(), "IndexedDataset: document ", doc,
           " out of range [0, ", num_documents(), ") of ", prefix_);
  return doc_idx_at(doc + 1);
}

int64_t IndexedDataset::document_length(int64_t doc) const {
  int64_t n = 0;
  for (int64_t s = document_first(doc), e = document_end(doc); s < e; ++s) n += length_at(s);
  return n;
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const {
  TD_CHECK(seq >= 0 && seq < sequence_count_, "IndexedDataset::read: sequence ", seq,
           " out of range [0, ", sequence_count_, ") of ", prefix_);
  const int64_t len = length_at(seq);
  TD_CHECK(offset >= 0 && length >= 0 && offset <= len && length <= len - offset,
           "IndexedDataset::read: tokens [", offset, ", ", offset + length, ") out of range for ",
           "sequence ", seq, " of length ", len, " in ", prefix_);
  if (length == 0) return;
  const auto* src = static_cast<const unsigned char*>(bin_map_) + pointer_at(seq) +
                    offset * static_cast<int64_t>(itemsize_);
  dispatch_int_code(dtype_code_, "IndexedDataset::read", [&]<typename T>() {
    if constexpr (std::is_same_v<T, int64_t>) {
      std::memcpy(out, src, static_cast<size_t>(length) * sizeof(T));
    } else {
      for (int64_t i = 0; i < length; ++i)
        out[i] = static_cast<int64_t>(load<T>(src + i * sizeof(T)));
    }
  });
}

Tensor IndexedDataset::get(int64_t seq, int64_t offset, int64_t length) const {
  TD_CHECK(seq >= 0 && seq < sequence_count_, "IndexedDataset::get: sequence ", seq,
           " out of range [0, ", sequence_count_, ") of ", prefix_);
  if (length < 0) {
    TD_CHECK(length == -1, "IndexedDataset::get: length must be >= 0 or -1 (to the end), got ",
             length);
    length = std::max<int64_t>(length_at(seq) - offset, 0);
  }
  Tensor t = Tensor::empty({length}, DType::Int64);
  read(seq, offset, length, t.data_ptr<int64_t>());
  return t;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n == 0) return;
  TD_CHECK(std::fwrite(p, 1, n, f) == n, "IndexedDatasetBuilder: writing ", path,
           " failed: ", errno_text());
}

// Flushes, fsyncs and closes; the caller renames afterwards (Note [Atomic finalize]).
void sync_close(std::FILE*& f, const std::string& path) {
  const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const std::string e = errno_text();
  const bool closed = std::fclose(f) == 0;
  f = nullptr;
  TD_CHECK(ok && closed, "IndexedDatasetBuilder: flushing ", path, " failed: ", e);
}

}  // namespace

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, uint8_t dtype_code)
    : prefix_(std::move(prefix)), dtype_code_(dtype_code) {
  TD_CHECK(is_integer_dtype_code(dtype_code), "IndexedDatasetBuilder: dtype code ", int(dtype_code),
           " (", dtype_code_name(dtype_code),
           ") is not an integer token dtype (use 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64 or "
           "8 uint16)");
  itemsize_ = dtype_code_size(dtype_code);
  const std::string tmp = prefix_ + ".bin.tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  TD_CHECK(bin_ != nullptr, "IndexedDatasetBuilder: cannot create ", tmp, ": ", errno_text());
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) {  // abandoned: leave the destination untouched and remove the temporaries
    if (bin_) std::fclose(bin_);
    std::remove((prefix_ + ".bin.tmp").c_str());
    std::remove((prefix_ + ".idx.tmp").c_str());
  }
}

void IndexedDatasetBuilder::add_sequence(const int64_t* tokens, int64_t n) {
  TD_CHECK(!finalized_, "IndexedDatasetBuilder::add_sequence: ", prefix_, " is already finalized");
  TD_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(),
           "IndexedDatasetBuilder::add_sequence: sequence length ", n,
           " is outside [0, 2^31) (the index stores int32 lengths)");
  int64_t lo = 0, hi = 0;
  code_range(dtype_code_, lo, hi);
  for (int64_t i = 0; i < n; ++i) {
    TD_CHECK(tokens[i] >= lo && tokens[i] <= hi, "IndexedDatasetBuilder::add_sequence: token ",
             tokens[i], " at position ", i, " does not fit dtype ", dtype_code_name(dtype_code_),
             " [", lo, ", ", hi, "] (use a wider dtype, e.g. best_dtype_code(vocab_size))");
  }
  buf_.resize(static_cast<size_t>(n) * itemsize_);
  dispatch_int_code(dtype_code_, "IndexedDatasetBuilder", [&]<typename T>() {
    for (int64_t i = 0; i < n; ++i) {
      const T v = static_cast<T>(tokens[i]);
      std::memcpy(buf_.data() + i * sizeof(T), &v, sizeof(T));
    }
  });
  write_all(bin_, buf_.data(), buf_.size(), prefix_ + ".bin.tmp");
  lengths_.push_back(static_cast<int32_t>(n));
}

void IndexedDatasetBuilder::end_document() {
  TD_CHECK(!finalized_, "IndexedDatasetBuilder::end_document: ", prefix_, " is already finalized");
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

// Note [Atomic finalize]: both files are written under temporary names, fsynced, then renamed.
// A crash or an exception before the renames leaves any previous PREFIX.bin/.idx as they were;
// after them, a reader sees a complete pair. (The .bin is renamed first: a reader racing the
// two renames sees the old index, whose validation against the new .bin fails loudly.)
void IndexedDatasetBuilder::finalize() {
  TD_CHECK(!finalized_, "IndexedDatasetBuilder::finalize: ", prefix_, " is already finalized");
  // Sequences added after the last end_document() form a final document.
  if (doc_idx_.back() != static_cast<int64_t>(lengths_.size())) end_document();
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  sync_close(bin_, bin_tmp);

  std::FILE* idx = std::fopen(idx_tmp.c_str(), "wb");
  TD_CHECK(idx != nullptr, "IndexedDatasetBuilder: cannot create ", idx_tmp, ": ", errno_text());
  try {
    const uint64_t version = 1, sc = lengths_.size(), dc = doc_idx_.size();
    write_all(idx, kMagic, 9, idx_tmp);
    write_all(idx, &version, 8, idx_tmp);
    write_all(idx, &dtype_code_, 1, idx_tmp);
    write_all(idx, &sc, 8, idx_tmp);
    write_all(idx, &dc, 8, idx_tmp);
    write_all(idx, lengths_.data(), lengths_.size() * 4, idx_tmp);
    std::vector<int64_t> pointers(lengths_.size());
    int64_t ptr = 0;
    for (size_t i = 0; i < lengths_.size(); ++i) {
      pointers[i] = ptr;
      ptr += static_cast<int64_t>(lengths_[i]) * static_cast<int64_t>(itemsize_);
    }
    write_all(idx, pointers.data(), pointers.size() * 8, idx_tmp);
    write_all(idx, doc_idx_.data(), doc_idx_.size() * 8, idx_tmp);
    sync_close(idx, idx_tmp);
  } catch (...) {
    if (idx) std::fclose(idx);
    throw;
  }
  const std::string bin = prefix_ + ".bin", idxp = prefix_ + ".idx";
  TD_CHECK(std::rename(bin_tmp.c_str(), bin.c_str()) == 0, "IndexedDatasetBuilder: renaming ",
           bin_tmp, " to ", bin, " failed: ", errno_text());
  TD_CHECK(std::rename(idx_tmp.c_str(), idxp.c_str()) == 0, "IndexedDatasetBuilder: renaming ",
           idx_tmp, " to ", idxp, " failed: ", errno_text());
  finalized_ = true;
}

uint8_t IndexedDatasetBuilder::best_dtype_code(int64_t vocab_size) {
  return vocab_size < 65500 ? kDTypeUInt16 : kDTypeInt32;
}

}  // namespace td::data
