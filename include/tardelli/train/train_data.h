#pragma once
// The batches a training run reads: from a Megatron-format dataset (data/gpt_dataset.h through
// data/data_loader.h) or synthetic tokens. Both follow the same sampler: a step of micro-batches
// takes micro_batch x dp_size consecutive global samples and data-parallel rank r reads its
// slice, so a run's data position is one number, the global sample count (consumed_samples),
// whatever the layout (Megatron's rule; a checkpoint stores it).
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "tardelli/core/tensor.h"
#include "tardelli/data/data_loader.h"
#include "tardelli/data/gpt_dataset.h"
#include "tardelli/parallel/pipeline_runtime.h"

namespace td::train {

using parallel::MicroBatch;

// Where micro-batches come from: next() is this rank's next (input, target) pair, both int64
// [micro_batch, seq_len] on the host.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual MicroBatch next() = 0;
  // The global sample count after the batches next() has returned.
  virtual int64_t consumed_samples() const = 0;
};

// Uniform random tokens, a pure function of (seed, global sample index): sample i is seq_len + 1
// tokens drawn by randint from Generator(seed ^ 0x5EED5EED, subsequence i), so every layout and
// every resume position reads the same tokens (python -m tardelli.train's synthetic data).
class SyntheticBatches : public BatchSource {
 public:
  SyntheticBatches(int64_t vocab_size, int64_t seq_len, uint64_t seed, int64_t micro_batch,
                   int64_t dp_rank = 0, int64_t dp_size = 1, int64_t consumed_samples = 0);
  MicroBatch next() override;
  int64_t consumed_samples() const override { return consumed_; }
  // Sample i: int64 [seq_len + 1].
  Tensor sample(int64_t i) const;

 private:
  int64_t vocab_size_, seq_len_;
  uint64_t seed_;
  int64_t micro_batch_, dp_rank_, dp_size_, consumed_;
};

// A DataLoader's [micro_batch, seq_len + 1] batches cut into (input, target).
class DatasetBatches : public BatchSource {
 public:
  DatasetBatches(std::shared_ptr<const data::GPTDataset> dataset, int64_t micro_batch,
                 int64_t dp_rank, int64_t dp_size, int64_t consumed_samples);
  MicroBatch next() override;
  int64_t consumed_samples() const override { return loader_.consumed_samples(); }

 private:
  data::DataLoader loader_;
};

// Another source's batches cut to this context-parallel rank's tokens along the sequence
// (parallel::zigzag_slice: chunks r and 2 cp - 1 - r of 2 cp, Note [Zigzag layout] in
// parallel/context_parallel.h): the ranks of a cp group read the same samples and each keeps
// its part.
class ContextParallelBatches : public BatchSource {
 public:
  ContextParallelBatches(std::unique_ptr<BatchSource> source, int cp_rank, int cp_size);
  MicroBatch next() override;
  int64_t consumed_samples() const override { return source_->consumed_samples(); }

 private:
  std::unique_ptr<BatchSource> source_;
  int rank_, size_;
};

struct DataOptions {
  std::string prefix;      // Megatron dataset PREFIX (.idx/.bin); empty with synthetic
  bool synthetic = false;  // random tokens instead of a dataset
  int64_t vocab_size = 0;  // 0: from PREFIX.tokenizer/ (required with synthetic)
  int64_t seq_len = 0;
  uint64_t seed = 0;
  std::array<double, 3> split = {98, 1, 1};
  int64_t micro_batch = 1;
  int64_t dp_rank = 0, dp_size = 1;
  // Context parallelism: the loaders' batches are this cp rank's tokens (ContextParallelBatches).
  int cp_rank = 0, cp_size = 1;
};

// The run's data: the vocabulary size, the tokenizer directory (PREFIX.tokenizer/ when
// preprocess wrote one) and the loaders over the train and validation splits.
class TrainData {
 public:
  // td::Error naming the prefix when the dataset cannot be opened, the training split is empty
  // or no vocabulary size can be found.
  explicit TrainData(DataOptions options);

  int64_t vocab_size() const { return vocab_size_; }
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  // The training batches from global sample `consumed_samples` on (both loaders: this cp rank's
  // tokens under context parallelism).
  std::unique_ptr<BatchSource> train_loader(int64_t consumed_samples) const;
  // A fresh loader over the validation split from its start (every evaluation sees the same
  // batches); null when the split is empty. Synthetic data validates on seed + 1.
  std::unique_ptr<BatchSource> valid_loader() const;

 private:
  std::unique_ptr<BatchSource> on_cp(std::unique_ptr<BatchSource> source) const;

  DataOptions o_;
  int64_t vocab_size_ = 0;
  std::string tokenizer_dir_;
  std::shared_ptr<const data::GPTDataset> train_, valid_;
};

// The vocabulary size recorded in a tokenizer directory written by python -m
// tardelli.data.preprocess (its vocab.json entries plus added tokens); td::Error naming the file
// when it cannot be read.
int64_t tokenizer_vocab_size(const std::string& dir);

}  // namespace td::train
