#pragma once
// The safetensors format (huggingface/safetensors), read and written by the library itself.
//
//   [u64 little-endian N][N bytes of JSON header][data section]
//   header: {"__metadata__": {str: str} (optional),
//            "<name>": {"dtype": "F32"|"BF16"|"F16"|"I32"|"I64"|"BOOL"|"F8_E4M3"|"F8_E5M2",
//                       "shape": [..],
//                       "data_offsets": [begin, end)}, ...}   (offsets relative to the data)
//
// Reading validates the whole file before trusting it (as the reference implementation does):
// a file shorter than 8 bytes, a header length beyond the file, malformed JSON (td::json's
// strict parser: duplicate names are an error), an unknown or unsupported dtype, a shape whose
// byte size does not match its byte range, overlapping ranges, gaps, ranges beyond the data
// section (a truncated file) or trailing bytes, and BOOL bytes other than 0/1 are each a
// td::Error that names the file and, where there is one, the tensor.
//
// Writing is deterministic and byte-compatible with the reference writer (safetensors 0.4+):
// "__metadata__" first (when given), tensors laid out contiguously ordered by dtype (I64, F32,
// I32, BF16, F16, F8_E4M3, F8_E5M2, BOOL: the reference's descending dtype order) then by name,
// compact JSON header padded with spaces so the data starts at a multiple of 8. The file is
// written to `path + ".tmp"`, flushed to disk and renamed over `path`, so readers never see a
// partial file.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in file order (by data offset)
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)

  // The tensor called `name`; td::Error naming the file's tensors when absent.
  const Tensor& at(const std::string& name) const;
  const Tensor* find(const std::string& name) const;
};

// Reads every tensor into fresh contiguous CPU tensors (64-byte aligned, owned by the library).
SafetensorsFile load_safetensors(const std::string& path);

// Writes `tensors` (any layout or device; copied to contiguous CPU bytes) atomically. Names must
// be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// "F32" <-> DType::Float32, ... (td::Error for names outside the six supported dtypes).
const char* safetensors_dtype_name(DType dtype);
DType safetensors_dtype(const std::string& name);

}  // namespace td::checkpoint
