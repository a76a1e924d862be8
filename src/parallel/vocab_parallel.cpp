#include "tardelli/parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/autograd/engine.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/embedding.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"
#include "tardelli/ops/view.h"

namespace td::parallel {

namespace dist = td::distributed;

int64_t padded_vocab_size(int64_t vocab_size, int tp_size, int64_t multiple) {
  TD_CHECK(vocab_size > 0 && tp_size > 0 && multiple > 0,
           "padded_vocab_size: vocab_size, tp_size and multiple must be > 0, got ", vocab_size,
           ", ", tp_size, ", ", multiple);
  const int64_t m = multiple * tp_size;
  return (vocab_size + m - 1) / m * m;
}

VocabRange vocab_range(int64_t padded_vocab, int rank, int size) {
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "vocab_range: rank ", rank, " is not in [0, ",
           size, ")");
  TD_CHECK(padded_vocab > 0 && padded_vocab % size == 0, "vocab_range: padded vocabulary ",
           padded_vocab, " is not a positive multiple of the tp size ", size);
  const int64_t n = padded_vocab / size;
  return {rank * n, (rank + 1) * n};
}

Tensor shard_vocab_rows(const Tensor& full, int64_t padded_vocab, int rank, int size) {
  const char* op = "shard_vocab_rows";
  ops::check_defined(full, op, "full");
  TD_CHECK(full.dim() == 2, op, ": expected a 2-D [V, h] table, got ", describe(full));
  TD_CHECK(full.size(0) <= padded_vocab, op, ": table ", describe(full),
           " has more rows than the padded vocabulary ", padded_vocab);
  const VocabRange r = vocab_range(padded_vocab, rank, size);
  Tensor out = zeros({r.size(), full.size(1)}, {full.dtype(), full.device(), false});
  const int64_t hi = std::min(r.end, full.size(0));
  if (hi > r.start)
    out.narrow(0, 0, hi - r.start).copy_(full.detach().narrow(0, r.start, hi - r.start));
  return out;
}

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& w_shard, const CommPtr& tp,
                                int64_t vocab_start, bool sequence_parallel, int64_t seq_dim) {
  const char* op = "vocab_parallel_embedding";
  ops::check_defined(ids, op, "ids");
  ops::check_defined(w_shard, op, "w_shard");
  TD_CHECK(tp != nullptr, op, ": the tensor-parallel communicator is null");
  TD_CHECK(is_integral(ids.dtype()), op, ": ids must be int32 or int64, got ", describe(ids));
  TD_CHECK(w_shard.dim() == 2, op, ": w_shard must be 2-D [V_pad/tp, h], got ", describe(w_shard));
  const int64_t rows = w_shard.size(0), padded = rows * tp->size();
  TD_CHECK(vocab_start >= 0 && vocab_start + rows <= padded, op, ": vocab_start ", vocab_start,
           " with ", rows, " rows is outside the padded vocabulary ", padded);
  TD_CHECK(!sequence_parallel || (seq_dim >= 0 && seq_dim < ids.dim()), op,
           ": sequence parallelism splits dim ", seq_dim, ", which ids ", describe(ids),
           " does not have");
  // Note [Masked lookup]: ids of other ranks look up row 0 and their output rows are zeroed by
  // masked_fill, whose backward zeroes their gradient too, so row 0 receives nothing from them.
  std::vector<int64_t> id = to_vector<int64_t>(ids);
  std::vector<int64_t> local(id.size());
  std::vector<uint8_t> other(id.size());
  for (size_t i = 0; i < id.size(); ++i) {
    TD_CHECK(id[i] >= 0 && id[i] < padded, op, ": id ", id[i], " at position ", i,
             " is out of range for the padded vocabulary ", padded);
    const bool mine = id[i] >= vocab_start && id[i] < vocab_start + rows;
    local[i] = mine ? id[i] - vocab_start : 0;
    other[i] = mine ? 0 : 1;
  }
  Shape mask_shape = ids.sizes();
  mask_shape.push_back(1);
  Tensor mask = Tensor::empty(mask_shape, DType::Bool);
  std::copy(other.begin(), other.end(), static_cast<uint8_t*>(mask.data_ptr()));
  Tensor partial = masked_fill(embedding(w_shard, from_vector(local, ids.sizes())),
                               mask.to(w_shard.device()), 0.0);
  return sequence_parallel ? dist::reduce_scatter_to_sequence(partial, tp, seq_dim)
                           : dist::reduce_from_region(partial, tp);
}

namespace {

// A shard of `columns` vocabulary columns starting at vocab_start of the padded vocabulary
// (columns x tp), of which the first true_vocab_size are real.
void check_vocab_shard(const char* op, int64_t columns, int tp, int64_t vocab_start,
                       int64_t true_vocab_size) {
  const int64_t padded = columns * tp;
  TD_CHECK(columns > 0 && vocab_start >= 0 && vocab_start + columns <= padded &&
               vocab_start % columns == 0,
           op, ": vocab_start ", vocab_start, " is not the start of a ", columns,
           "-column shard of the padded vocabulary ", padded);
  TD_CHECK(true_vocab_size > 0 && true_vocab_size <= padded, op, ": true_vocab_size ",
           true_vocab_size, " must be in [1, ", padded, "]");
}

// What the fused backward recomputes the softmax from (fp32, detached).
struct VpCeSaved {
  Tensor logits;                // [N, Vs] fp32 contiguous
  std::vector<int64_t> target;  // local column of the target, -1 when not on this rank
  std::vector<uint8_t> ignored;
  Tensor max, sum;    // [N]: the global row max and sum of exp(x - max)
  int64_t valid = 0;  // local columns with id < true_vocab_size
  int64_t count = 0;  // rows not ignored
};

// Each row's target as a local column of this shard (-1 when on another rank), whether it is
// ignored, and the rows that count; a target outside the vocabulary is a td::Error.
struct VpTargets {
  std::vector<int64_t> column;
  std::vector<uint8_t> ignored;
  int64_t count = 0;
};

VpTargets vp_targets(const char* op, const Tensor& targets, int64_t vocab_start, int64_t columns,
                     int64_t true_vocab_size, int64_t ignore_index) {
  const std::vector<int64_t> t = to_vector<int64_t>(targets);
  const int64_t n = static_cast<int64_t>(t.size());
  VpTargets out;
  out.column.assign(n, -1);
  out.ignored.assign(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) {
      out.ignored[i] = 1;
      continue;
    }
    TD_CHECK(t[i] >= 0 && t[i] < true_vocab_size, op, ": target ", t[i], " at position ", i,
             " is out of range for the vocabulary size ", true_vocab_size);
    ++out.count;
    if (t[i] >= vocab_start && t[i] < vocab_start + columns) out.column[i] = t[i] - vocab_start;
  }
  return out;
}

// Each row's loss from the reduced [N, 2] (sum of exp(x - max), target logit - max):
// log(sum) - target, 0 for ignored rows.
std::vector<float> vp_row_losses(const Tensor& st, const std::vector<uint8_t>& ignored) {
  const float* sp = st.data_ptr<float>();
  std::vector<float> loss(ignored.size(), 0.0f);
  for (size_t i = 0; i < loss.size(); ++i)
    if (!ignored[i]) loss[i] = std::log(sp[2 * i]) - sp[2 * i + 1];
  return loss;
}

Tensor vp_ce_backward(const Tensor& grad, const VpCeSaved& s, Reduction reduction, DType dtype,
                      const Shape& shape) {
  const int64_t N = s.logits.size(0), Vs = s.logits.size(1);
  std::vector<float> g = to_vector<float>(grad);
  int64_t g_stride = 1;
  if (reduction != Reduction::None) {
    g_stride = 0;
    const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(s.count) : 1.0;
    g[0] = static_cast<float>(g[0] * scale);  // count == 0: every row is ignored, unread
  }
  Tensor dx = Tensor::empty({N, Vs}, DType::Float32);
  const float* x = s.logits.data_ptr<float>();
  const float* mx = s.max.data_ptr<float>();
  const float* sm = s.sum.data_ptr<float>();
  float* d = dx.data_ptr<float>();
  cpu::parallel_for(N, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(Vs, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) {
                        float* di = d + i * Vs;
                        const float gi = s.ignored[i] ? 0.0f : g[i * g_stride];
                        if (gi == 0.0f) {
                          std::fill(di, di + Vs, 0.0f);
                          continue;
                        }
                        const float* xi = x + i * Vs;
                        const float inv = 1.0f / sm[i];
                        for (int64_t j = 0; j < s.valid; ++j)
                          di[j] = gi * (std::exp(xi[j] - mx[i]) * inv);
                        std::fill(di + s.valid, di + Vs, 0.0f);
                        if (s.target[i] >= 0) di[s.target[i]] -= gi;
                      }
                    });
  dx = dx.view(shape);
  return dtype == DType::Float32 ? dx : dx.to(dtype);
}

// The forward of the vocab-parallel cross-entropy on fp32 contiguous logits [N, Vs] (a view of
// them is kept in the result): the targets' local columns, the global row max and sum of exp
// (Note [Three reductions]) and each row's loss in `loss` (0 for ignored rows).
VpCeSaved vp_ce_forward(const char* op, const Tensor& logits, const Tensor& targets,
                        const CommPtr& tp, int64_t vocab_start, int64_t true_vocab_size,
                        int64_t ignore_index, std::vector<float>& loss) {
  VpCeSaved s;
  const int64_t N = logits.size(0), Vs = logits.size(1);
  s.logits = logits;
  s.valid = std::clamp<int64_t>(true_vocab_size - vocab_start, 0, Vs);
  VpTargets t = vp_targets(op, targets, vocab_start, Vs, true_vocab_size, ignore_index);
  s.target = std::move(t.column);
  s.ignored = std::move(t.ignored);
  s.count = t.count;
  // Note [Three reductions]: the row max must be global before exp (else the partial sums
  // would be scaled differently on each rank); the sum of exp and the target logit then travel
  // in one [N, 2] all-reduce. Ranks with no valid columns contribute -inf and 0.
  const float* x = s.logits.data_ptr<float>();
  s.max = Tensor::empty({N}, DType::Float32);
  float* mx = s.max.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, cpu::kGrain / Vs);
  cpu::parallel_for(N, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < s.valid; ++j) m = std::max(m, x[i * Vs + j]);
      mx[i] = m;
    }
  });
  tp->all_reduce(s.max, dist::ReduceOp::Max);
  Tensor st = Tensor::empty({N, 2}, DType::Float32);
  float* sp = st.data_ptr<float>();
  cpu::parallel_for(N, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* xi = x + i * Vs;
      float acc = 0.0f;
      for (int64_t j = 0; j < s.valid; ++j) acc += std::exp(xi[j] - mx[i]);
      sp[2 * i] = acc;
      sp[2 * i + 1] = s.target[i] >= 0 ? xi[s.target[i]] - mx[i] : 0.0f;
    }
  });
  tp->all_reduce(st, dist::ReduceOp::Sum);
  s.sum = st.select(1, 0).contiguous();
  loss = vp_row_losses(st, s.ignored);
  return s;
}

// The gradient of the summed loss, softmax - onehot, written over s.logits in place (rows of
// ignored targets and the padded columns zero): vp_ce_backward's values for a gradient of 1.
void vp_ce_grad_in_place(VpCeSaved& s) {
  const int64_t N = s.logits.size(0), Vs = s.logits.size(1);
  float* x = s.logits.data_ptr<float>();
  const float* mx = s.max.data_ptr<float>();
  const float* sm = s.sum.data_ptr<float>();
  cpu::parallel_for(N, std::max<int64_t>(1, cpu::kGrain / std::max<int64_t>(Vs, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) {
                        float* xi = x + i * Vs;
                        if (s.ignored[i]) {
                          std::fill(xi, xi + Vs, 0.0f);
                          continue;
                        }
                        const float inv = 1.0f / sm[i];
                        for (int64_t j = 0; j < s.valid; ++j) xi[j] = std::exp(xi[j] - mx[i]) * inv;
                        std::fill(xi + s.valid, xi + Vs, 0.0f);
                        if (s.target[i] >= 0) xi[s.target[i]] -= 1.0f;
                      }
                    });
}

Tensor logits_fp32(const Tensor& h, const Tensor& w) {
  Tensor l = linear(h, w);
  return l.dtype() == DType::Float32 ? l : to_dtype(l, DType::Float32);
}

// Note [Vocab-parallel head on a device]: one chunk of the fused head with tensor ops, for
// logits l [k, Vs] fp32 on any device: the rows' max over the valid columns, the sum of
// exp(l - max) and the target logits are formed there, copied to the host ([k] each) and
// reduced over tp exactly as vp_ce_forward does (the same host tensors, the same order), so
// each row's loss (into `loss`) is computed on the host alike. With `grad` returns the chunk's
// logit gradient (softmax - onehot, zero on padded columns and ignored rows) as a new tensor on
// l's device; else an undefined tensor. *count receives the rows not ignored (the targets are
// read once, here).
Tensor vp_ce_chunk_tensor_ops(const char* op, const Tensor& l, const Tensor& targets,
                              const CommPtr& tp, int64_t vocab_start, int64_t true_vocab_size,
                              int64_t ignore_index, bool grad, std::vector<float>& loss,
                              int64_t* count) {
  const int64_t k = l.size(0), Vs = l.size(1);
  const int64_t valid = std::clamp<int64_t>(true_vocab_size - vocab_start, 0, Vs);
  const VpTargets t = vp_targets(op, targets, vocab_start, Vs, true_vocab_size, ignore_index);
  *count = t.count;
  std::vector<int64_t> local_rows, local_flat;  // rows whose target is on this rank
  for (int64_t i = 0; i < k; ++i) {
    if (t.column[i] >= 0) {
      local_rows.push_back(i);
      local_flat.push_back(i * Vs + t.column[i]);
    }
  }
  const Device dev = l.device();
  const Tensor lv = valid > 0 ? l.narrow(1, 0, valid) : Tensor();
  Tensor mx_dev = valid > 0
                      ? amax(lv, {1})
                      : full({k}, -std::numeric_limits<double>::infinity(), {DType::Float32, dev});
  Tensor mx = mx_dev.to(kCPU).contiguous();  // Note [Three reductions]
  tp->all_reduce(mx, dist::ReduceOp::Max);
  mx_dev = mx.to(dev);
  const Tensor e = valid > 0 ? exp(sub(lv, mx_dev.unsqueeze(1))) : Tensor();
  const std::vector<float> sums =
      valid > 0 ? to_vector<float>(sum(e, {1}).to(kCPU)) : std::vector<float>(k, 0.0f);
  std::vector<float> tl;
  if (!local_flat.empty()) {
    const Tensor idx = from_vector<int64_t>(local_flat, {static_cast<int64_t>(local_flat.size())});
    tl = to_vector<float>(index_select(l.reshape({k * Vs}), 0, idx.to(dev)).to(kCPU));
  }
  const std::vector<float> mxv = to_vector<float>(mx);
  Tensor st = zeros({k, 2}, {DType::Float32});
  float* sp = st.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i) sp[2 * i] = sums[i];
  for (size_t j = 0; j < local_rows.size(); ++j) {
    const int64_t i = local_rows[j];
    sp[2 * i + 1] = tl[j] - mxv[i];
  }
  tp->all_reduce(st, dist::ReduceOp::Sum);
  loss = vp_row_losses(st, t.ignored);
  if (!grad) return Tensor();
  Tensor sum_dev = st.select(1, 0).contiguous().to(dev);
  Tensor dl = zeros({k, Vs}, {DType::Float32, dev});
  if (valid > 0) dl.narrow(1, 0, valid).copy_(div(e, sum_dev.unsqueeze(1)));
  if (t.count < k) {  // ignored rows: no gradient
    std::vector<float> keep(k);
    for (int64_t i = 0; i < k; ++i) keep[i] = t.ignored[i] ? 0.0f : 1.0f;
    dl = mul(dl, from_vector<float>(keep, {k, 1}).to(dev));
  }
  if (!local_flat.empty()) {
    const int64_t n = static_cast<int64_t>(local_flat.size());
    const Tensor idx = from_vector<int64_t>(local_flat, {n}).to(dev);
    // index_add(x, ...) is x with src added at the indices: the onehot subtracted.
    dl = index_add(dl.reshape({k * Vs}), 0, idx, full({n}, -1.0, {DType::Float32, dev}))
             .reshape({k, Vs});
  }
  return dl;
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& targets,
                                    const CommPtr& tp, int64_t vocab_start, int64_t true_vocab_size,
                                    int64_t ignore_index, Reduction reduction, bool tensor_ops) {
  const char* op = "vocab_parallel_cross_entropy";
  ops::check_defined(logits_shard, op, "logits_shard");
  ops::check_defined(targets, op, "targets");
  ops::check_floating(logits_shard, op);
  TD_CHECK(tp != nullptr, op, ": the tensor-parallel communicator is null");
  TD_CHECK(logits_shard.dim() >= 1, op, ": logits_shard must be [..., V_pad/tp], got ",
           describe(logits_shard));
  TD_CHECK(is_integral(targets.dtype()), op, ": targets must be int32 or int64, got ",
           describe(targets));
  const int64_t Vs = logits_shard.size(-1);
  Shape batch(logits_shard.sizes().begin(), logits_shard.sizes().end() - 1);
  TD_CHECK(targets.sizes() == batch, op, ": targets ", describe(targets), " must have shape ",
           shape_str(batch), " to match logits_shard ", describe(logits_shard));
  check_vocab_shard(op, Vs, tp->size(), vocab_start, true_vocab_size);

  TD_CHECK(targets.device() == logits_shard.device() || targets.device().is_cpu(), op, ": targets ",
           describe(targets), " must be on the CPU or the logits' device");

  const int64_t N = numel_of(batch);
  const bool grad = autograd::needs_grad({logits_shard});
  const Tensor l = logits_shard.detach().to(DType::Float32).contiguous().view({N, Vs});
  std::vector<float> loss;
  VpCeSaved s;
  Tensor dl;  // the tensor-ops path: softmax - onehot, for backward
  if (tensor_ops || !logits_shard.device().is_cpu()) {
    dl = vp_ce_chunk_tensor_ops(op, l, targets.reshape({N}), tp, vocab_start, true_vocab_size,
                                ignore_index, grad, loss, &s.count);
  } else {
    s = vp_ce_forward(op, l, targets, tp, vocab_start, true_vocab_size, ignore_index, loss);
  }

  Tensor out;
  if (reduction == Reduction::None) {
    out = from_vector(loss, batch).to(logits_shard.device());
    if (logits_shard.dtype() != DType::Float32) out = out.to(logits_shard.dtype());
  } else {
    double total = 0.0;  // fixed order: the same value on every rank
    for (float v : loss) total += v;
    if (reduction == Reduction::Mean) total /= static_cast<double>(s.count);  // 0/0: NaN
    out = scalar_tensor(total, logits_shard.dtype(), logits_shard.device());
  }
  if (grad && dl.defined()) {
    autograd::record(
        "VocabParallelCrossEntropyBackward", {logits_shard}, {&out},
        [dl, reduction, count = s.count, dt = logits_shard.dtype(), shape = logits_shard.sizes()](
            const TensorList& g, const std::vector<bool>&) -> TensorList {
          if (!g[0].defined()) return {Tensor()};
          autograd::NoGradGuard ng;
          // dl is the gradient of the summed loss; ignored rows are zero in it.
          Tensor d;
          if (reduction == Reduction::None) {
            d = mul(dl, g[0].to(DType::Float32).reshape({dl.size(0), 1}));
          } else {
            const double scale =
                reduction == Reduction::Mean ? 1.0 / static_cast<double>(count) : 1.0;
            d = mul(dl, g[0].item_double() * scale);
          }
          d = d.view(shape);
          return {dt == DType::Float32 ? d : d.to(dt)};
        });
  } else if (grad) {
    auto saved = std::make_shared<VpCeSaved>(std::move(s));
    autograd::record("VocabParallelCrossEntropyBackward", {logits_shard}, {&out},
                     [saved, reduction, dt = logits_shard.dtype(), shape = logits_shard.sizes()](
                         const TensorList& g, const std::vector<bool>&) -> TensorList {
                       if (!g[0].defined()) return {Tensor()};
                       return {vp_ce_backward(g[0], *saved, reduction, dt, shape)};
                     });
  }
  return out;
}

Tensor vocab_parallel_linear_cross_entropy(const Tensor& h, const Tensor& w_shard,
                                           const Tensor& targets, const CommPtr& tp,
                                           int64_t vocab_start, int64_t true_vocab_size,
                                           int64_t ignore_index, int64_t chunk_elems,
                                           bool tensor_ops) {
  const char* op = "vocab_parallel_linear_cross_entropy";
  ops::check_defined(h, op, "h");
  ops::check_defined(w_shard, op, "w_shard");
  ops::check_defined(targets, op, "targets");
  TD_CHECK(tp != nullptr, op, ": the tensor-parallel communicator is null");
  TD_CHECK(h.dim() == 2 && w_shard.dim() == 2 && h.size(1) == w_shard.size(1), op,
           ": expected h [N, d] and w_shard [V_pad/tp, d], got ", describe(h), " and ",
           describe(w_shard));
  TD_CHECK(is_integral(targets.dtype()) && targets.dim() == 1 && targets.size(0) == h.size(0), op,
           ": targets must be [", h.size(0), "] int32/int64 ids, got ", describe(targets));
  TD_CHECK(chunk_elems > 0, op, ": chunk_elems must be > 0, got ", chunk_elems);
  TD_CHECK(h.device() == w_shard.device(), op, ": h and w_shard must be on one device, got ",
           describe(h), " and ", describe(w_shard));
  const bool device_ops = tensor_ops || !h.device().is_cpu();
  const int64_t n = h.size(0), vs = w_shard.size(0);
  check_vocab_shard(op, vs, tp->size(), vocab_start, true_vocab_size);
  const int64_t rows =
      std::max<int64_t>(1, std::min<int64_t>(n, chunk_elems / std::max<int64_t>(vs, 1)));
  int64_t valid = 0;  // rows not ignored, summed over the chunks (their targets read once)
  Tensor hd = h.detach(), wd = w_shard.detach(), tg = targets.detach();

  // As td::linear_cross_entropy (Note [Chunked LM head]): when a gradient is needed the forward
  // also forms d h (this rank's partial over its vocabulary columns) and d w_shard chunk by
  // chunk, while the chunk's logits exist, and backward only scales them. The loss's reductions
  // over tp and those of its gradient all run in the forward, in the same order on every rank.
  const bool grad = autograd::needs_grad({h, w_shard});
  const bool need_h = grad && h.requires_grad(), need_w = grad && w_shard.requires_grad();
  Tensor gh = need_h ? zeros(hd.sizes(), {hd.dtype(), hd.device()}) : Tensor();
  Tensor gw = need_w ? zeros(wd.sizes(), {DType::Float32, wd.device()}) : Tensor();
  double total = 0.0;
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t k = std::min(rows, n - r0);
    Tensor hc = hd.narrow(0, r0, k), tc = tg.narrow(0, r0, k);
    autograd::NoGradGuard ng;
    const Tensor l = logits_fp32(hc, wd).contiguous();
    std::vector<float> loss;
    Tensor dl;
    if (device_ops) {
      int64_t counted = 0;
      dl = vp_ce_chunk_tensor_ops(op, l, tc, tp, vocab_start, true_vocab_size, ignore_index, grad,
                                  loss, &counted);
      valid += counted;
    } else {
      // Note [In-place vocab-parallel gradient]: the chunk's logits become their own gradient
      // (softmax - onehot, the values the op's backward gives for a gradient of 1), so a chunk
      // holds one [k, V/tp] fp32 buffer, as the single-rank head does.
      VpCeSaved st = vp_ce_forward(op, l, tc, tp, vocab_start, true_vocab_size, ignore_index, loss);
      valid += st.count;
      if (grad) {
        vp_ce_grad_in_place(st);
        dl = st.logits;
      }
    }
    double chunk = 0.0;  // the Sum reduction's order and its fp32 result
    for (float v : loss) chunk += v;
    total += static_cast<float>(chunk);
    if (!grad) continue;
    if (need_h) {
      Tensor d = dl.dtype() == hd.dtype() ? dl : to_dtype(dl, hd.dtype());
      gh.narrow(0, r0, k).copy_(mm(d, wd));
    }
    if (need_w) {
      Tensor hf = hc.dtype() == DType::Float32 ? hc : to_dtype(hc, DType::Float32);
      add_(gw, mm(transpose(dl, 0, 1), hf));
    }
  }
  Tensor out = scalar_tensor(valid > 0 ? static_cast<float>(total / static_cast<double>(valid))
                                       : std::numeric_limits<float>::quiet_NaN(),
                             DType::Float32, h.device());
  if (grad) {
    autograd::record(
        "VocabParallelLinearCrossEntropyBackward", {h, w_shard}, {&out},
        [gh, gw, valid, wdtype = wd.dtype()](const TensorList& g, const std::vector<bool>& need) {
          // New tensors, not the saved ones: a retained graph's second backward
          // must find them unchanged.
          autograd::NoGradGuard ng;
          const double s = valid > 0 ? g[0].item_double() / static_cast<double>(valid) : 0.0;
          Tensor dh = need[0] && gh.defined() ? mul(gh, s) : Tensor();
          Tensor dw = need[1] && gw.defined() ? mul(gw, s) : Tensor();
          if (dw.defined() && wdtype != DType::Float32) dw = to_dtype(dw, wdtype);
          return TensorList{dh, dw};
        });
  }
  return out;
}

}  // namespace td::parallel
