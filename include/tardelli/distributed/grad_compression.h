#pragma once
// Compressed data-parallel gradient reductions with error feedback: PowerSGD (Vogels et al.,
// NeurIPS 2019) and top-k / random-k sparsification. A DistributedDataParallel given a
// compressor (DDPOptions::compressor) hands it each bucket instead of all-reducing it.
//
// Note [Error feedback]: each rank keeps a residual e (what its compressed messages left out)
// and adds it to its next gradient before compressing, so nothing is lost, only delayed. With
// D_i = g_i + e_i on rank i (of P) and D' the mean the compressed exchange yields (the same on
// every rank), PowerSGD sets e_i = D_i - D' (Algorithm 2 of the paper; a rank's own rows of the
// low-rank approximation are not separable from the others'); top-k sets e_i = D_i with the
// sent entries zeroed. Either way the bookkeeping is exact: sum_i e_i + (what was applied) x P
// = sum_i D_i (PowerSGD: D' x P; top-k: the sum of every rank's sent entries).
//
// Note [PowerSGD]: per bucket, every parameter of 2 or more dims is a matrix M [rows, cols]
// (rows = its first dim); with Q [cols, r] warm-started from the previous step (the first from a
// seed shared by all ranks), P = M Q is all-reduced (mean, one message for the bucket's
// matrices), each P orthonormalized (Gram-Schmidt in fp32; a zero column stays zero), then
// Q = M^T P is all-reduced (mean) and M is replaced by P Q^T. Vectors (biases, norms) are
// all-reduced uncompressed. A matrix sends (rows + cols) r elements instead of rows x cols. At
// r = min(rows, cols) the approximation is exact (P spans M's column space), so the mean is
// reproduced to fp32 rounding.
//
// Note [Top-k]: per bucket, each rank sends the k = ceil(ratio x n) entries of D_i of largest
// magnitude (ties: the lower index), as (index, value) pairs all-gathered from every rank; the
// mean is the sum of all sent entries over P. Random-k sends k entries chosen uniformly by a
// per-rank, per-step generator instead (for comparison: unbiased but noisier). Selection runs on
// the host.
//
// Note [Compression warm-up]: a compressor can be switched off (set_active(false)) for the first
// steps of training, as PyTorch's PowerSGD hook does (start_powerSGD_iter): early gradients are
// large and change fast, so the low-rank or sparse approximation, even with error feedback, lags
// most there. An inactive compressor all-reduces the bucket uncompressed and leaves its error
// feedback and PowerSGD's Q untouched; the trainer's --compression-start-step switches it on.
//
// The compressors keep per-rank state (residuals, PowerSGD's Q) under stable names for
// checkpoints (state() / load_state()). A DDP runs them on its worker thread, bucket after
// bucket, while backward goes on (Note [Compressed buckets] in data_parallel.cpp); state() and
// load_state() belong between steps (after finish_grad_sync).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tardelli/core/tensor.h"
#include "tardelli/distributed/communicator.h"

namespace td::distributed {

// One parameter's place in a bucket buffer.
struct CompressedParam {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // first element in the bucket buffer
  int64_t numel = 0;
};

class GradCompressor {
 public:
  virtual ~GradCompressor() = default;
  // Replaces this rank's gradient in `buffer` (fp32, the bucket's used elements; `params` its
  // parameters in order) by the compressed exchange's mean over `comm` (average: divide the
  // sum by comm->size(); else the sum). Updates the error feedback. Collective over comm.
  // An inactive compressor (Note [Compression warm-up]) all-reduces `buffer` uncompressed.
  void reduce(size_t bucket, Tensor& buffer, const std::vector<CompressedParam>& params,
              const CommPtr& comm, bool average);
  // Switches compression on or off for the next reductions (between steps).
  void set_active(bool active) { active_ = active; }
  bool active() const { return active_; }
  // Elements this rank has sent since construction (the communication model's count).
  int64_t elements_sent() const { return sent_; }
  // Uncompressed elements the same reductions would have sent (bucket sizes).
  int64_t elements_dense() const { return dense_; }
  // Per-rank state by name (shared tensors); load_state copies values in (same names, shapes).
  virtual std::map<std::string, Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, Tensor>& state) = 0;
  virtual std::string name() const = 0;

 protected:
  // The compressed exchange of reduce() (Note [Error feedback]).
  virtual void compress_reduce(size_t bucket, Tensor& buffer,
                               const std::vector<CompressedParam>& params, const CommPtr& comm,
                               bool average) = 0;
  int64_t sent_ = 0, dense_ = 0;

 private:
  bool active_ = true;
};

// PowerSGD of rank `rank` (>= 1); `seed` initializes Q (the same on every rank). td::Error from
// reduce() when a matrix has a dimension smaller than the rank (naming it and its shape).
std::shared_ptr<GradCompressor> powersgd_compressor(int64_t rank, uint64_t seed = 0);
// Top-k with `ratio` in (0, 1]; random = true: random-k with per-rank generators from `seed`.
std::shared_ptr<GradCompressor> topk_compressor(double ratio, bool random = false,
                                                uint64_t seed = 0);

}  // namespace td::distributed
