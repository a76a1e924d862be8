#include "tardelli/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "tardelli/core/json.h"

namespace td::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length must not
// make us allocate gigabytes before failing).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

#define ST_CHECK(cond, path, ...) TD_CHECK(cond, "safetensors: '", path, "': ", __VA_ARGS__)
#define ST_FAIL(path, ...) TD_ERROR("safetensors: '", path, "': ", __VA_ARGS__)

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_str() {
  return std::strerror(errno);
}

// Reads exactly n bytes at offset (retrying short reads); false on EOF before n bytes.
bool pread_all(int fd, void* buf, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    ST_CHECK(r > 0, path, "write failed: ", errno_str());
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// The reference's dtype order (its Dtype enum, declared by increasing size); the writer sorts
// by it descending, then by name.
int dtype_rank(DType t) {
  switch (t) {
    case DType::Bool:
      return 0;
    case DType::Float8E5M2:
      return 1;
    case DType::Float8E4M3FN:
      return 2;
    case DType::Float16:
      return 3;
    case DType::BFloat16:
      return 4;
    case DType::Int32:
      return 5;
    case DType::Float32:
      return 6;
    case DType::Int64:
      return 7;
  }
  return -1;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Validates one tensor entry of the header.
Entry parse_entry(const std::string& path, const std::string& name, const json::Value& v) {
  ST_CHECK(v.is_object(), path, "tensor '", name, "': header entry must be an object, got ",
           json::type_name(v.type()));
  const json::Value *dt = nullptr, *shape = nullptr, *offs = nullptr;
  for (const auto& [k, f] : v.as_object()) {
    if (k == "dtype")
      dt = &f;
    else if (k == "shape")
      shape = &f;
    else if (k == "data_offsets")
      offs = &f;
    else
      ST_FAIL(path, "tensor '", name, "': unexpected header field \"", k,
              "\" (expected dtype, shape, data_offsets)");
  }
  ST_CHECK(dt && shape && offs, path, "tensor '", name, "': header entry needs dtype, shape and ",
           "data_offsets");
  ST_CHECK(dt->is_string(), path, "tensor '", name, "': dtype must be a string");
  Entry e;
  e.name = name;
  try {
    e.dtype = safetensors_dtype(dt->as_string());
  } catch (const Error& err) {
    ST_FAIL(path, "tensor '", name, "': ", err.what());
  }
  ST_CHECK(shape->is_array(), path, "tensor '", name, "': shape must be an array of integers");
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : shape->as_array()) {
    ST_CHECK(d.is_int() && d.as_int() >= 0, path, "tensor '", name,
             "': shape must hold non-negative integers, got ", json::dump(*shape));
    auto n = static_cast<uint64_t>(d.as_int());
    if (n != 0 && numel > std::numeric_limits<uint64_t>::max() / n) overflow = true;
    numel *= n;
    e.shape.push_back(d.as_int());
  }
  uint64_t item = itemsize(e.dtype);
  overflow = overflow || numel > std::numeric_limits<uint64_t>::max() / item;
  ST_CHECK(!overflow, path, "tensor '", name, "': shape ", json::dump(*shape),
           " overflows the byte count");
  ST_CHECK(offs->is_array() && offs->size() == 2 && offs->as_array()[0].is_int() &&
               offs->as_array()[1].is_int() && offs->as_array()[0].as_int() >= 0 &&
               offs->as_array()[1].as_int() >= 0,
           path, "tensor '", name, "': data_offsets must be [begin, end] (non-negative integers), ",
           "got ", json::dump(*offs));
  e.begin = static_cast<uint64_t>(offs->as_array()[0].as_int());
  e.end = static_cast<uint64_t>(offs->as_array()[1].as_int());
  ST_CHECK(e.begin <= e.end, path, "tensor '", name, "': data_offsets [", e.begin, ", ", e.end,
           ") has end before begin");
  ST_CHECK(e.end - e.begin == numel * item, path, "tensor '", name, "': dtype ", dt->as_string(),
           " and shape ", json::dump(*shape), " need ", numel * item, " bytes but data_offsets [",
           e.begin, ", ", e.end, ") hold ", e.end - e.begin);
  return e;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "F32";
    case DType::BFloat16:
      return "BF16";
    case DType::Float16:
      return "F16";
    case DType::Int32:
      return "I32";
    case DType::Int64:
      return "I64";
    case DType::Bool:
      return "BOOL";
    // The reference's names for torch.float8_e4m3fn / float8_e5m2 (its E4M3 is the FN variant)
    case DType::Float8E4M3FN:
      return "F8_E4M3";
    case DType::Float8E5M2:
      return "F8_E5M2";
  }
  TD_ERROR("safetensors: invalid dtype value ", static_cast<int>(dtype));
}

DType safetensors_dtype(const std::string& name) {
  for (DType t : {DType::Float32, DType::BFloat16, DType::Float16, DType::Int32, DType::Int64,
                  DType::Bool, DType::Float8E4M3FN, DType::Float8E5M2})
    if (name == safetensors_dtype_name(t)) return t;
  static const char* kKnownUnsupported[] = {"F64", "U8", "I8",      "I16",     "U16", "U32",
                                            "U64", "F4", "F6_E2M3", "F6_E3M2", "C64", "F8_E8M0"};
  for (const char* u : kKnownUnsupported)
    if (name == u)
      TD_ERROR("dtype ", name,
               " is not supported by tardelli (supported: F32, BF16, F16, I32, I64, BOOL, "
               "F8_E4M3, F8_E5M2)");
  TD_ERROR("unknown dtype \"", name,
           "\" (supported: F32, BF16, F16, I32, I64, BOOL, F8_E4M3, F8_E5M2)");
}

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  const Tensor* t = find(name);
  if (t == nullptr) {
    std::string names;
    for (const auto& nt : tensors) names += (names.empty() ? "" : ", ") + nt.first;
    TD_ERROR("safetensors: no tensor named '", name, "' (the file has: ", names, ")");
  }
  return *t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ST_CHECK(f.fd >= 0, path, "cannot open: ", errno_str());
  struct stat st {};
  ST_CHECK(::fstat(f.fd, &st) == 0, path, "cannot stat: ", errno_str());
  ST_CHECK(S_ISREG(st.st_mode), path, "not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  ST_CHECK(file_size >= 8, path, "file is ", file_size,
           " bytes, shorter than the 8-byte header length (not a safetensors file?)");

  unsigned char len_bytes[8];
  ST_CHECK(pread_all(f.fd, len_bytes, 8, 0), path, "read failed: ", errno_str());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  ST_CHECK(header_len <= file_size - 8, path, "header length ", header_len,
           " runs past the end of the file (", file_size,
           " bytes): truncated or not a safetensors file");
  ST_CHECK(header_len <= kMaxHeaderBytes, path, "header length ", header_len,
           " exceeds the 100 MB limit");
  std::string header(header_len, '\0');
  ST_CHECK(pread_all(f.fd, header.data(), header_len, 8), path, "read failed: ", errno_str());

  json::Value root;
  try {
    root = json::parse(header);
  } catch (const Error& e) {
    ST_FAIL(path, "malformed header: ", e.what());
  }
  ST_CHECK(root.is_object(), path, "header must be a JSON object, got ",
           json::type_name(root.type()));

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, v] : root.as_object()) {
    if (name == "__metadata__") {
      ST_CHECK(v.is_object(), path, "__metadata__ must be an object of strings");
      for (const auto& [k, s] : v.as_object()) {
        ST_CHECK(s.is_string(), path, "__metadata__ value of \"", k, "\" must be a string, got ",
                 json::type_name(s.type()));
        out.metadata.emplace(k, s.as_string());
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, v));
  }

  // Note [Offset validation]: sorted by range, the tensors must tile the data section exactly:
  // each range starts where the previous one ended, the first at 0 and the last at the end of
  // the file. An overlap, a gap, a range past the end (a truncated file) or trailing bytes all
  // mean the header and the data disagree.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = file_size - 8 - header_len;
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    ST_CHECK(e.begin >= pos, path, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
             ") overlap tensor '", prev ? prev->name : "", "' [", prev ? prev->begin : 0, ", ", pos,
             ")");
    ST_CHECK(e.begin == pos, path, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
             ") leave a gap: bytes [", pos, ", ", e.begin, ") belong to no tensor");
    ST_CHECK(e.end <= data_size, path, "tensor '", e.name, "': data_offsets [", e.begin, ", ",
             e.end, ") run past the data section (", data_size,
             " bytes): the file is truncated or its header is wrong");
    pos = e.end;
    prev = &e;
  }
  ST_CHECK(pos == data_size, path, "the data section has ", data_size, " bytes but the tensors ",
           "cover only ", pos, " (trailing bytes: inconsistent header)");

  const uint64_t data_start = 8 + header_len;
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const size_t n = e.end - e.begin;
    ST_CHECK(n == 0 || pread_all(f.fd, t.data_ptr(), n, data_start + e.begin), path, "tensor '",
             e.name, "': read failed (file changed while reading?)");
    if (e.dtype == DType::Bool) {
      const auto* b = static_cast<const unsigned char*>(t.data_ptr());
      for (size_t i = 0; i < n; ++i)
        ST_CHECK(b[i] <= 1, path, "tensor '", e.name, "': BOOL element ", i, " holds byte ",
                 static_cast<int>(b[i]), " (must be 0 or 1)");
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Contiguous CPU copies (no autograd), in the reference's order.
  struct Item {
    const std::string* name;
    Tensor t;
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    ST_CHECK(!name.empty(), path, "tensor names must be non-empty");
    ST_CHECK(name != "__metadata__", path, "'__metadata__' is reserved and cannot name a tensor");
    ST_CHECK(t.defined(), path, "tensor '", name, "' is undefined");
    Tensor c = t.detach();
    if (!c.is_cpu()) c = c.to(kCPU);
    if (!c.is_contiguous()) c = c.contiguous();
    items.push_back({&name, c});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    int ra = dtype_rank(a.t.dtype()), rb = dtype_rank(b.t.dtype());
    return ra != rb ? ra > rb : *a.name < *b.name;
  });
  {
    std::vector<const std::string*> names;
    for (const auto& it : items) names.push_back(it.name);
    std::sort(names.begin(), names.end(),
              [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t i = 1; i < names.size(); ++i)
      ST_CHECK(*names[i] != *names[i - 1], path, "duplicate tensor name '", *names[i], "'");
  }

  json::Value header = json::Object{};
  if (!metadata.empty()) {
    json::Value meta = json::Object{};
    for (const auto& [k, v] : metadata) meta.set(k, v);
    header.set("__metadata__", std::move(meta));
  }
  uint64_t offset = 0;
  for (const auto& it : items) {
    json::Value shape = json::Array{};
    for (int64_t d : it.t.sizes()) shape.push_back(d);
    const uint64_t nbytes = it.t.nbytes();
    json::Value e = json::Object{};
    e.set("dtype", safetensors_dtype_name(it.t.dtype()));
    e.set("shape", std::move(shape));
    e.set("data_offsets",
          json::Array{static_cast<int64_t>(offset), static_cast<int64_t>(offset + nbytes)});
    header.set(*it.name, std::move(e));
    offset += nbytes;
  }
  std::string text = json::dump(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  const std::string tmp = path + ".tmp";
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ST_CHECK(f.fd >= 0, tmp, "cannot create: ", errno_str());
    try {
      write_all(f.fd, len_bytes, 8, tmp);
      write_all(f.fd, text.data(), text.size(), tmp);
      for (const auto& it : items)
        if (it.t.nbytes() > 0) write_all(f.fd, it.t.data_ptr(), it.t.nbytes(), tmp);
      ST_CHECK(::fsync(f.fd) == 0, tmp, "fsync failed: ", errno_str());
      int fd = f.fd;
      f.fd = -1;
      ST_CHECK(::close(fd) == 0, tmp, "close failed: ", errno_str());
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_str();
    ::unlink(tmp.c_str());
    ST_FAIL(path, "cannot rename ", tmp, " into place: ", err);
  }
}

}  // namespace td::checkpoint
