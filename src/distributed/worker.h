#pragma once
// A FIFO worker thread for communication that must not block the caller: the tasks of one
// Worker run one after another, in submission order, so collectives issued from it keep the
// order every rank submitted them in. Used by the two-level communicator (Note [Two-level
// worker] in hierarchical.cpp) and by DistributedDataParallel's compressed buckets.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// Runs submitted tasks on its own thread, in order; a task's failure is kept for its Work.
class Worker {
 public:
  struct Task {
    std::function<void()> run;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };

  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::shared_ptr<Task> submit(std::function<void()> run) {
    auto t = std::make_shared<Task>();
    t->run = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(t);
    }
    cv_.notify_all();
    return t;
  }

 private:
  void loop() {
    while (true) {
      std::shared_ptr<Task> t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        t = queue_.front();
        queue_.pop_front();
      }
      try {
        autograd::NoGradGuard ng;
        t->run();
      } catch (...) {
        t->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(t->mu);
        t->done = true;
      }
      t->cv.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// The Work of a submitted task: wait() blocks until it ran and rethrows its failure.
class QueuedWork final : public Work {
 public:
  explicit QueuedWork(std::shared_ptr<Worker::Task> t) : t_(std::move(t)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(t_->mu);
    t_->cv.wait(lock, [&] { return t_->done; });
    if (t_->error) std::rethrow_exception(t_->error);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(t_->mu);
    return t_->done;
  }

 private:
  std::shared_ptr<Worker::Task> t_;
};

}  // namespace td::distributed
