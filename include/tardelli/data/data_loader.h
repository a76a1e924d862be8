#pragma once
// A prefetching loader of GPT micro-batches with Megatron's pretraining sampler
// (MegatronPretrainingSampler): global step t consumes the micro_batch * dp_size consecutive
// global sample indices starting at consumed + t * micro_batch * dp_size, and data-parallel rank
// r takes [start + r * micro_batch, start + (r + 1) * micro_batch).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "tardelli/core/tensor.h"
#include "tardelli/data/gpt_dataset.h"

namespace td::data {

class DataLoader {
 public:
  // consumed_samples: the global sample count already trained on (from a checkpoint); the
  // loader resumes exactly there. prefetch: batches prepared ahead by the background thread.
  DataLoader(std::shared_ptr<const GPTDataset> dataset, int64_t micro_batch, int64_t dp_rank = 0,
             int64_t dp_size = 1, int64_t consumed_samples = 0, int prefetch = 2);
  ~DataLoader();  // stops and joins the background thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch of this rank: int64 [micro_batch, seq_len + 1]; inputs are [:, :-1],
  // targets [:, 1:]. An error raised while preparing it is rethrown here.
  Tensor next();
  // The global sample count after the batches next() has returned (what a checkpoint stores).
  int64_t consumed_samples() const;

  int64_t micro_batch() const { return micro_batch_; }
  int64_t dp_rank() const { return dp_rank_; }
  int64_t dp_size() const { return dp_size_; }
  int64_t global_batch() const { return micro_batch_ * dp_size_; }
  const GPTDataset& dataset() const { return *dataset_; }

 private:
  void worker();
  Tensor make_batch(int64_t step) const;

  std::shared_ptr<const GPTDataset> dataset_;
  int64_t micro_batch_, dp_rank_, dp_size_, start_consumed_;
  size_t prefetch_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Item {
    Tensor batch;
    std::exception_ptr error;
  };
  std::deque<Item> queue_;
  int64_t returned_ = 0;  // batches handed out by next()
  bool stop_ = false;
  bool failed_ = false;  // the worker stored an error and exited
  std::thread thread_;
};

}  // namespace td::data
