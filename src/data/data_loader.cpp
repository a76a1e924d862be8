// The prefetching micro-batch loader (Megatron's pretraining sampler order).
#include "tardelli/data/data_loader.h"

#include <utility>

#include "tardelli/core/error.h"

namespace td::data {

DataLoader::DataLoader(std::shared_ptr<const GPTDataset> dataset, int64_t micro_batch,
                       int64_t dp_rank, int64_t dp_size, int64_t consumed_samples, int prefetch)
    : dataset_(std::move(dataset)),
      micro_batch_(micro_batch),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      start_consumed_(consumed_samples) {
  TD_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  TD_CHECK(micro_batch >= 1, "DataLoader: micro_batch must be >= 1, got ", micro_batch);
  TD_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "DataLoader: dp_rank ", dp_rank,
           " is outside [0, dp_size = ", dp_size, ")");
  TD_CHECK(consumed_samples >= 0, "DataLoader: consumed_samples must be >= 0, got ",
           consumed_samples);
  TD_CHECK(prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", prefetch);
  prefetch_ = static_cast<size_t>(prefetch);
  thread_ = std::thread([this] { worker(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Tensor DataLoader::make_batch(int64_t step) const {
  const int64_t l1 = dataset_->seq_len() + 1;
  Tensor b = Tensor::empty({micro_batch_, l1}, DType::Int64);
  int64_t* p = b.data_ptr<int64_t>();
  const int64_t first = start_consumed_ + step * global_batch() + dp_rank_ * micro_batch_;
  for (int64_t r = 0; r < micro_batch_; ++r) dataset_->sample(first + r, p + r * l1);
  return b;
}

// Note [Loader thread]: one producer fills a bounded queue in step order; next() is the only
// consumer. A failed batch is queued as an error (in order, after the good batches before it)
// and ends the producer, so next() rethrows it exactly when that batch is due.
void DataLoader::worker() {
  for (int64_t step = 0;; ++step) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || queue_.size() < prefetch_; });
      if (stop_) return;
    }
    Item item;
    try {
      item.batch = make_batch(step);
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
      failed_ = failed;
    }
    cv_.notify_all();
    if (failed) return;
  }
}

Tensor DataLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  // A failed batch stays queued, so every later call rethrows it too.
  if (queue_.front().error) std::rethrow_exception(queue_.front().error);
  Item item = std::move(queue_.front());
  queue_.pop_front();
  ++returned_;
  lock.unlock();
  cv_.notify_all();
  return item.batch;
}

int64_t DataLoader::consumed_samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return start_consumed_ + returned_ * global_batch();
}

}  // namespace td::data
