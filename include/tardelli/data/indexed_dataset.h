#pragma once
// Megatron-LM's memory-mapped indexed dataset (megatron/core/datasets/indexed_dataset.py),
// byte-compatible in both directions. PREFIX.bin holds the tokens of every sequence back to
// back; PREFIX.idx describes them:
//
//   magic  "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 | sequence_count u64 |
//   document_count u64 | sequence_lengths int32[sequence_count] |
//   sequence_pointers int64[sequence_count] (byte offsets into .bin) |
//   document_indices int64[document_count]   (0, then the first sequence after each document)
//   [ sequence_modes int8[sequence_count]: multimodal datasets only; accepted and ignored ]
//
// All integers little-endian. Dtype codes are Megatron's DType enum (kDType* below).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::data {

// Megatron's DType codes.
inline constexpr uint8_t kDTypeUInt8 = 1;
inline constexpr uint8_t kDTypeInt8 = 2;
inline constexpr uint8_t kDTypeInt16 = 3;
inline constexpr uint8_t kDTypeInt32 = 4;
inline constexpr uint8_t kDTypeInt64 = 5;
inline constexpr uint8_t kDTypeFloat64 = 6;
inline constexpr uint8_t kDTypeFloat32 = 7;
inline constexpr uint8_t kDTypeUInt16 = 8;

// Bytes per element of a dtype code; a td::Error for an unknown code.
size_t dtype_code_size(uint8_t code);
// "uint16", "int32", ... (numpy's names); "unknown" for a bad code.
const char* dtype_code_name(uint8_t code);
bool is_integer_dtype_code(uint8_t code);

class IndexedDataset {
 public:
  // Maps PREFIX.idx and PREFIX.bin read-only and validates every field before trusting it
  // (see validate() in the .cpp); a td::Error names the file and what is wrong.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  int64_t num_sequences() const { return sequence_count_; }
  int64_t num_documents() const { return document_count_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  uint8_t token_dtype_code() const { return dtype_code_; }
  int64_t sequence_length(int64_t seq) const;
  // Document k spans sequences [document_first(k), document_end(k)).
  int64_t document_first(int64_t doc) const;
  int64_t document_end(int64_t doc) const;
  // Tokens of document k (the sum of its sequences' lengths).
  int64_t document_length(int64_t doc) const;

  // Copies tokens [offset, offset+length) of sequence `seq` into out, converting to int64.
  // Thread-safe (reads the read-only mapping only).
  void read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const;
  // The same as an int64 tensor; length -1 means to the end of the sequence.
  Tensor get(int64_t seq, int64_t offset = 0, int64_t length = -1) const;

 private:
  void validate(size_t idx_bytes, size_t bin_bytes);

  std::string prefix_, idx_path_, bin_path_;
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  void* bin_map_ = nullptr;  // null when .bin is empty
  size_t bin_size_ = 0;
  uint8_t dtype_code_ = 0;
  size_t itemsize_ = 0;
  int64_t sequence_count_ = 0;
  int64_t document_count_ = 0;
  int64_t num_tokens_ = 0;
  // The three arrays inside the .idx mapping. They start at byte 34, so they are not aligned
  // for their types: every access goes through memcpy (Note [Unaligned index] in the .cpp).
  const unsigned char* lengths_ = nullptr;   // int32[sequence_count]
  const unsigned char* pointers_ = nullptr;  // int64[sequence_count]
  const unsigned char* doc_idx_ = nullptr;   // int64[document_count]
  int64_t length_at(int64_t i) const;
  int64_t pointer_at(int64_t i) const;
  int64_t doc_idx_at(int64_t k) const;
};

// Writes PREFIX.bin / PREFIX.idx. Nothing touches the destination until finalize(), which writes
// PREFIX.bin.tmp / PREFIX.idx.tmp, fsyncs and renames them into place.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, uint8_t dtype_code);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence; every value must fit the dtype (a td::Error names the first that
  // does not, and nothing is appended).
  void add_sequence(const int64_t* tokens, int64_t n);
  // Closes the current document (the sequences added since the last end_document()).
  void end_document();
  void finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }

  // Megatron's rule (DType.optimal_dtype): uint16 when vocab_size < 65500, else int32.
  static uint8_t best_dtype_code(int64_t vocab_size);

 private:
  std::string prefix_;
  uint8_t dtype_code_;
  size_t itemsize_;
  std::FILE* bin_ = nullptr;  // PREFIX.bin.tmp, open until finalize()
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<char> buf_;
  bool finalized_ = false;
};

}  // namespace td::data
