#pragma once
// GPT pretraining samples over a document range of an IndexedDataset, in the style of
// Megatron's GPTDataset: documents are concatenated into one token stream and cut into
// fixed-length samples that cross document boundaries.
//
// Epoch e (unbounded; built lazily): the documents of the range, in an order shuffled from
// (seed, e), are concatenated into a stream of N tokens (the same N every epoch).
// samples_per_epoch S = (N - 1) / seq_len. Chunk k of the stream is tokens
// [k*seq_len, k*seq_len + seq_len + 1): consecutive chunks share one token (the last target of
// one is the first input of the next) and the < seq_len tokens left at the end are dropped.
// Sample j of epoch e is chunk sample_order(e)[j], a second permutation from (seed, e).
// Global sample i belongs to epoch i / S.
//
// The permutations are Fisher-Yates shuffles driven by Philox4x32-10 (core/rng.h) with an
// unbiased bounded draw, so they are the same on every platform and standard library.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/data/indexed_dataset.h"

namespace td::data {

struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
  int64_t size() const { return end - begin; }
};

// Megatron's train/valid/test split (get_train_valid_test_split_): ratios (up to 3, missing
// ones are 0, e.g. {98, 1, 1}) are normalized; bound k+1 = bound k + round_half_even(ratio_k * n);
// then every bound after the first is shifted by the same amount so the last equals n. (In the
// degenerate cases where that shift would make a range negative, bounds are clamped into
// [previous bound, n].)
std::array<DocumentRange, 3> split_documents(int64_t num_documents, std::vector<double> ratios);

class GPTDataset {
 public:
  GPTDataset(std::shared_ptr<const IndexedDataset> dataset, int64_t doc_begin, int64_t doc_end,
             int64_t seq_len, uint64_t seed);

  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  int64_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  int64_t doc_begin() const { return doc_begin_; }
  int64_t doc_end() const { return doc_end_; }
  int64_t tokens_per_epoch() const { return num_tokens_; }  // N
  const IndexedDataset& indexed() const { return *dataset_; }

  // Writes the seq_len + 1 tokens of global sample i (i >= 0) to out. Thread-safe.
  void sample(int64_t i, int64_t* out) const;
  // The same as an int64 tensor [seq_len + 1].
  Tensor sample(int64_t i) const;

  // The permutations of epoch e (for tests and inspection): the dataset-level document ids in
  // stream order, and the stream chunk of each sample of the epoch.
  std::vector<int64_t> document_order(int64_t epoch) const;
  std::vector<int64_t> sample_order(int64_t epoch) const;

 private:
  struct Epoch {
    int64_t index = -1;
    std::vector<int64_t> docs;       // document ids in stream order
    std::vector<int64_t> doc_start;  // stream offset of each, plus N at the end
    std::vector<int64_t> chunks;     // sample j -> chunk
  };
  std::shared_ptr<const Epoch> epoch(int64_t e) const;
  std::shared_ptr<const Epoch> build_epoch(int64_t e) const;

  std::shared_ptr<const IndexedDataset> dataset_;
  int64_t doc_begin_, doc_end_, seq_len_;
  uint64_t seed_;
  std::vector<int64_t> doc_len_;  // tokens of each document of the range
  int64_t num_tokens_ = 0;
  int64_t samples_per_epoch_ = 0;

  // Note [Epoch cache]: the two most recently used epochs. A loader thread reading ahead across
  // an epoch boundary and a caller still in the previous epoch both hit; memory stays
  // O(documents + samples per epoch).
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const Epoch>> cache_;
};

}  // namespace td::data
