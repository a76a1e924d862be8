#include "tardelli/parallel/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "ops/common.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/distributed/collectives.h"
#include "tardelli/ops/attention.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/indexing.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/view.h"

namespace td::parallel {

namespace dist = td::distributed;
using autograd::needs_grad;
using autograd::record;

CPComm parse_cp_comm(const std::string& s) {
  if (s == "ring") return CPComm::Ring;
  if (s == "a2a") return CPComm::AllToAll;
  TD_CHECK(false, "cp_comm: expected 'ring' or 'a2a', got '", s, "'");
  return CPComm::Ring;
}

const char* cp_comm_name(CPComm c) {
  return c == CPComm::Ring ? "ring" : "a2a";
}

std::vector<int64_t> zigzag_positions(int64_t T, int rank, int size) {
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "zigzag_positions: rank ", rank,
           " is outside a group of size ", size);
  TD_CHECK(T > 0 && T % (2 * size) == 0, "zigzag_positions: the sequence length ", T,
           " must be divisible by 2 x cp = ", 2 * size, " (the zigzag layout cuts it into ",
           2 * size, " equal chunks)");
  const int64_t c = T / (2 * size);
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(2 * c));
  for (int64_t chunk : {int64_t{rank}, int64_t{2 * size - 1 - rank}})
    for (int64_t t = 0; t < c; ++t) pos.push_back(chunk * c + t);
  return pos;
}

Tensor zigzag_slice(const Tensor& x, int64_t dim, int rank, int size) {
  ops::check_defined(x, "zigzag_slice", "input");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TD_CHECK(d >= 0 && d < x.dim(), "zigzag_slice: dim ", dim, " out of range for ", describe(x));
  TD_CHECK(size >= 1 && rank >= 0 && rank < size, "zigzag_slice: rank ", rank,
           " is outside a group of size ", size);
  const int64_t T = x.size(d);
  TD_CHECK(T % (2 * size) == 0, "zigzag_slice: size ", T, " of dim ", d, " of ", describe(x),
           " must be divisible by 2 x cp = ", 2 * size);
  const int64_t c = T / (2 * size);
  Tensor xd = x.detach();
  return cat({xd.narrow(d, rank * c, c), xd.narrow(d, (2 * size - 1 - rank) * c, c)}, d)
      .contiguous();
}

Tensor zigzag_gather(const Tensor& x, const dist::CommPtr& cp, int64_t dim) {
  ops::check_defined(x, "zigzag_gather", "input");
  TD_CHECK(cp != nullptr, "zigzag_gather: the communicator is null");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TD_CHECK(d >= 0 && d < x.dim(), "zigzag_gather: dim ", dim, " out of range for ", describe(x));
  const int N = cp->size();
  TD_CHECK(x.size(d) % 2 == 0, "zigzag_gather: ", cp->where(), ": the local size ", x.size(d),
           " of dim ", d, " of ", describe(x), " must be even (two zigzag chunks)");
  if (N == 1) return x.detach();
  Tensor g = dist::all_gather_along(x, cp, d);  // rank s's chunks s, 2N-1-s at [2cs, 2c(s+1))
  const int64_t c = x.size(d) / 2, T = 2 * c * N;
  std::vector<int64_t> idx(static_cast<size_t>(T));
  for (int64_t p = 0; p < T; ++p) {
    const int64_t j = p / c;
    const int64_t s = j < N ? j : 2 * N - 1 - j;
    idx[static_cast<size_t>(p)] = s * 2 * c + (j < N ? 0 : c) + p % c;
  }
  return index_select(g, d, from_vector<int64_t>(idx, {T}).to(x.device()));
}

namespace {

constexpr int kTagK = 0x4350, kTagV = 0x4351, kTagDK = 0x4352, kTagDV = 0x4353;

struct AttnShape {
  int64_t B, H, Hkv, L, D, Dv;  // L = 2c local tokens
  double scale;
};

AttnShape check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const dist::CommPtr& cp,
                       CPComm mode, std::optional<double> scale) {
  const char* op = "context_parallel_attention";
  ops::check_defined(q, op, "q");
  ops::check_defined(k, op, "k");
  ops::check_defined(v, op, "v");
  TD_CHECK(cp != nullptr, op, ": the cp communicator is null");
  TD_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": ", cp->where(),
           ": q, k, v must be [B, heads, tokens, head_dim], got ", describe(q), ", ", describe(k),
           ", ", describe(v));
  AttnShape s{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), v.size(3), 0.0};
  TD_CHECK(k.size(0) == s.B && v.size(0) == s.B && v.size(1) == s.Hkv && k.size(2) == s.L &&
               v.size(2) == s.L && k.size(3) == s.D,
           op, ": ", cp->where(), ": q ", describe(q), ", k ", describe(k), ", v ", describe(v),
           " do not match (this rank's tokens of q, k and v must be the same)");
  TD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op, ": ", cp->where(),
           ": q, k, v dtypes differ: ", describe(q), ", ", describe(k), ", ", describe(v));
  TD_CHECK(s.Hkv > 0 && s.H % s.Hkv == 0, op, ": ", cp->where(), ": kv heads ", s.Hkv,
           " must divide the query heads ", s.H);
  TD_CHECK(s.L > 0 && s.L % 2 == 0, op, ": ", cp->where(), ": the local sequence length ", s.L,
           " of ", describe(q),
           " must be even: the zigzag layout gives every rank two chunks (the full length must "
           "be divisible by 2 x cp = ",
           2 * cp->size(), ")");
  if (mode == CPComm::AllToAll) {
    const int N = cp->size();
    TD_CHECK(s.H % N == 0 && s.Hkv % N == 0, op, " (cp_comm=a2a): ", cp->where(),
             ": the all-to-all splits heads over the cp group: query heads ", s.H, " and kv heads ",
             s.Hkv, " must both be divisible by cp = ", N, " (use cp_comm=ring)");
  }
  s.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  return s;
}

Tensor f32(const Tensor& t) {
  return t.dtype() == DType::Float32 ? t : to_dtype(t, DType::Float32);
}

// dst (a view) += src, in place, in dst's dtype.
void accumulate(Tensor dst, const Tensor& src) {
  add_(dst, src);
}

// Note [Ring merge]: two partial attentions of the same query rows over disjoint key sets,
// (o_a, lse_a) and (o_b, lse_b), combine exactly as
//   lse = log(exp(lse_a) + exp(lse_b)) = m + log(exp(lse_a - m) + exp(lse_b - m)), m = max,
//   o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b
// since each o_x is the softmax-weighted mean over its own keys with normalizer exp(lse_x).
// The accumulators are fp32 whatever the compute dtype. Step 0 (the rank's own keys) covers
// every query row with at least one visible key, so lse_a is always finite.
void merge_composite(const Tensor& acc_out, const Tensor& acc_lse, const AttentionForward& part) {
  Tensor lb = part.lse;
  Tensor m = maximum(acc_lse, lb);
  Tensor lse = add(m, log(add(exp(sub(acc_lse, m)), exp(sub(lb, m)))));
  Tensor wa = unsqueeze(exp(sub(acc_lse, lse)), -1), wb = unsqueeze(exp(sub(lb, lse)), -1);
  copy_into(acc_out, add(mul(acc_out, wa), mul(f32(part.out), wb)));
  copy_into(acc_lse, lse);
}

// acc_out [B, H, L, Dv] and acc_lse [B, H, L] (contiguous fp32) take rows [row0, row0 + R) of
// the merge with part (out [B, H, R, Dv] any strides, lse [B, H, R]).
void merge(const Tensor& acc_out, const Tensor& acc_lse, const AttentionForward& part,
           int64_t row0) {
  const int64_t B = acc_out.size(0), H = acc_out.size(1), L = acc_out.size(2);
  const int64_t Dv = acc_out.size(3), R = part.out.size(2);
  if (acc_out.is_cpu() && part.out.dtype() == DType::Float32) {
    // One pass over the rows on the CPU (merge_composite makes ~10 passes and temporaries).
    float* ao = acc_out.data_ptr<float>();
    float* al = acc_lse.data_ptr<float>();
    const Tensor pl = part.lse.contiguous();
    const float* po = part.out.data_ptr<float>();
    const float* plp = pl.data_ptr<float>();
    const Shape& st = part.out.strides();
#pragma omp parallel for collapse(2) if (B * H * R * Dv > (int64_t{1} << 16))
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < R; ++i) {
          float& la = al[(b * H + h) * L + row0 + i];
          const float lb = plp[(b * H + h) * R + i];
          const float m = std::max(la, lb);
          const float lse = m + std::log(std::exp(la - m) + std::exp(lb - m));
          const float wa = std::exp(la - lse), wb = std::exp(lb - lse);
          float* o = ao + ((b * H + h) * L + row0 + i) * Dv;
          const float* p = po + b * st[0] + h * st[1] + i * st[2];
          for (int64_t d = 0; d < Dv; ++d) o[d] = wa * o[d] + wb * p[d * st[3]];
          la = lse;
        }
      }
    }
    return;
  }
  merge_composite(acc_out.narrow(2, row0, R), acc_lse.narrow(2, row0, R), part);
}

// What rank r computes against the key/value block of rank s under the zigzag layout (Note
// [Zigzag layout]; chunk size c): its own block (s == r) causally over its 2c rows; a block from
// an earlier rank (s < r): all its queries against the block's first chunk, unmasked (both of
// r's chunks come after chunk s, and chunk 2N-1-s comes after both); a block from a later rank
// (s > r): only r's second chunk (2N-1-r), against both chunks unmasked (its first chunk r
// precedes both). Every step after the first is thus one c x 2c product.
enum class Part { Full, Causal, FirstKv, SecondQ };

Part part_for(bool causal, int r, int s) {
  if (!causal) return Part::Full;
  if (s == r) return Part::Causal;
  return s < r ? Part::FirstKv : Part::SecondQ;
}

struct RingResult {
  Tensor out;  // [B, H, 2c, Dv] q dtype
  Tensor lse;  // [B, H, 2c] fp32
};

// The k/v transfer of one ring step: receive the previous rank's block while sending ours.
struct Transfer {
  Tensor k, v;
  std::vector<dist::WorkPtr> works;
  void wait() {
    for (auto& w : works) w->wait();
    works.clear();
  }
};

// Posts the receive of the previous rank's pair (shapes and dtypes of k, v).
Transfer post_recv(const Tensor& k, const Tensor& v, const dist::CommPtr& cp, int tag_k,
                   int tag_v) {
  const int N = cp->size(), prev = (cp->rank() - 1 + N) % N;
  Transfer t{Tensor::empty(k.sizes(), k.dtype(), k.device()),
             Tensor::empty(v.sizes(), v.dtype(), v.device()),
             {}};
  t.works.push_back(cp->recv(t.k, prev, tag_k, true));
  t.works.push_back(cp->recv(t.v, prev, tag_v, true));
  return t;
}

// Posts the send of (k, v) to the next rank.
Transfer post_send(const Tensor& k, const Tensor& v, const dist::CommPtr& cp, int tag_k,
                   int tag_v) {
  const int next = (cp->rank() + 1) % cp->size();
  Transfer t{k, v, {}};
  t.works.push_back(cp->send(k, next, tag_k, true));
  t.works.push_back(cp->send(v, next, tag_v, true));
  return t;
}

// One ring step's transfer: receive the previous rank's block while sending ours.
Transfer start_transfer(const Tensor& k, const Tensor& v, const dist::CommPtr& cp, int tag_k,
                        int tag_v) {
  Transfer t = post_recv(k, v, cp, tag_k, tag_v);
  Transfer sent = post_send(k, v, cp, tag_k, tag_v);
  t.works.insert(t.works.end(), sent.works.begin(), sent.works.end());
  return t;
}

RingResult ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, const dist::CommPtr& cp,
                        bool causal, const AttnShape& s) {
  const int N = cp->size(), r = cp->rank();
  const int64_t c = s.L / 2;
  Tensor acc_out, acc_lse;
  Tensor ck = k, cv = v;
  for (int j = 0; j < N; ++j) {
    const int src = (r - j + N) % N;
    Transfer next;
    if (j + 1 < N) next = start_transfer(ck, cv, cp, kTagK, kTagV);
    const Part p = part_for(causal, r, src);
    if (j == 0) {
      AttentionForward f = flash_attention_forward(q, ck, cv, p == Part::Causal, s.scale);
      acc_out = f32(f.out).contiguous();
      acc_lse = f.lse.contiguous();
    } else if (p == Part::Full) {
      merge(acc_out, acc_lse, flash_attention_forward(q, ck, cv, false, s.scale), 0);
    } else if (p == Part::FirstKv) {
      merge(acc_out, acc_lse,
            flash_attention_forward(q, ck.narrow(2, 0, c), cv.narrow(2, 0, c), false, s.scale), 0);
    } else {
      merge(acc_out, acc_lse, flash_attention_forward(q.narrow(2, c, c), ck, cv, false, s.scale),
            c);
    }
    if (j + 1 < N) {
      next.wait();
      ck = next.k;
      cv = next.v;
    }
  }
  return {acc_out.dtype() == q.dtype() ? acc_out : to_dtype(acc_out, q.dtype()), acc_lse};
}

// Backward: the key/value blocks go around the ring once more; with each travels the fp32
// accumulator of its dk/dv, to which every rank adds its contribution (flash_attention_backward
// with the FINAL out and lse: the probabilities it recomputes are then the global ones) before
// passing it on; after N steps each accumulator is one hop short of its owner and a last send
// brings it home. dq never leaves the rank.
std::tuple<Tensor, Tensor, Tensor> ring_backward(const Tensor& g, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& out,
                                                 const Tensor& lse, const dist::CommPtr& cp,
                                                 bool causal, const AttnShape& s) {
  const int N = cp->size(), r = cp->rank();
  const int64_t c = s.L / 2;
  const TensorOptions fo{DType::Float32, q.device(), false};
  Tensor dq = zeros(q.sizes(), fo);
  Tensor ck = k, cv = v;
  Transfer acc_in;                 // the accumulator arriving for the next step
  std::vector<Transfer> acc_sent;  // sends in flight (their buffers stay alive)
  for (int j = 0; j < N; ++j) {
    const int src = (r - j + N) % N;
    Transfer next;
    if (j + 1 < N) next = start_transfer(ck, cv, cp, kTagK, kTagV);
    const Part p = part_for(causal, r, src);
    Tensor dq_part, dk_part, dv_part;  // this step's contributions
    if (p == Part::Full || p == Part::Causal) {
      std::tie(dq_part, dk_part, dv_part) =
          flash_attention_backward(g, q, ck, cv, out, lse, p == Part::Causal, s.scale);
      accumulate(dq, dq_part);
    } else if (p == Part::FirstKv) {
      std::tie(dq_part, dk_part, dv_part) = flash_attention_backward(
          g, q, ck.narrow(2, 0, c), cv.narrow(2, 0, c), out, lse, false, s.scale);
      accumulate(dq, dq_part);
    } else {
      std::tie(dq_part, dk_part, dv_part) = flash_attention_backward(
          g.narrow(2, c, c), q.narrow(2, c, c), ck, cv, out.narrow(2, c, c),
          lse.narrow(2, c, c).contiguous(), false, s.scale);
      accumulate(dq.narrow(2, c, c), dq_part);
    }
    // The block's accumulator: fresh at step 0, else the one that arrived (added to in place).
    Tensor dk_acc, dv_acc;
    if (j == 0) {
      dk_acc = zeros(k.sizes(), fo);
      dv_acc = zeros(v.sizes(), fo);
    } else {
      acc_in.wait();
      dk_acc = acc_in.k;
      dv_acc = acc_in.v;
    }
    const bool first = p == Part::FirstKv;
    accumulate(first ? dk_acc.narrow(2, 0, c) : dk_acc, dk_part);
    accumulate(first ? dv_acc.narrow(2, 0, c) : dv_acc, dv_part);
    // Pass the accumulator on (after the last step this is the trip home) and post the
    // receive of the one arriving for the next step.
    acc_sent.push_back(post_send(dk_acc, dv_acc, cp, kTagDK, kTagDV));
    acc_in = post_recv(dk_acc, dv_acc, cp, kTagDK, kTagDV);
    if (j + 1 < N) {
      next.wait();
      ck = next.k;
      cv = next.v;
    }
  }
  acc_in.wait();
  for (auto& t : acc_sent) t.wait();
  auto back = [](const Tensor& t, DType dt) { return t.dtype() == dt ? t : to_dtype(t, dt); };
  return {back(dq, q.dtype()), back(acc_in.k, k.dtype()), back(acc_in.v, v.dtype())};
}

// ---- all-to-all (Ulysses) ----

// x [B, Hx, 2c, D] (this rank's zigzag tokens, all heads) -> [B, Hx/N, T, D] (head group
// `rank`, every token in natural order).
Tensor seq_to_heads(const Tensor& x, const dist::CommPtr& cp) {
  const int N = cp->size();
  const int64_t B = x.size(0), Hn = x.size(1) / N, L = x.size(2), D = x.size(3), c = L / 2;
  Tensor in = x.detach().reshape({B, N, Hn, L, D}).permute({1, 0, 2, 3, 4}).contiguous();
  Tensor recv = Tensor::empty(in.sizes(), in.dtype(), in.device());
  cp->all_to_all(recv, in);  // recv[s] = rank s's tokens of our head group
  Tensor y = Tensor::empty({B, Hn, N * L, D}, x.dtype(), x.device());
  for (int s = 0; s < N; ++s) {
    Tensor part = recv.narrow(0, s, 1).view({B, Hn, L, D});
    copy_into(y.narrow(2, int64_t{s} * c, c), part.narrow(2, 0, c));
    copy_into(y.narrow(2, int64_t{2 * N - 1 - s} * c, c), part.narrow(2, c, c));
  }
  return y;
}

// The inverse: y [B, Hn, T, D] (our head group, all tokens) -> [B, Hn * N, 2c, D].
Tensor heads_to_seq(const Tensor& y, const dist::CommPtr& cp) {
  const int N = cp->size();
  const int64_t B = y.size(0), Hn = y.size(1), T = y.size(2), D = y.size(3), c = T / (2 * N);
  Tensor in = Tensor::empty({N, B, Hn, 2 * c, D}, y.dtype(), y.device());
  Tensor yd = y.detach();
  for (int s = 0; s < N; ++s) {
    Tensor part = in.narrow(0, s, 1).view({B, Hn, 2 * c, D});
    copy_into(part.narrow(2, 0, c), yd.narrow(2, int64_t{s} * c, c));
    copy_into(part.narrow(2, c, c), yd.narrow(2, int64_t{2 * N - 1 - s} * c, c));
  }
  Tensor recv = Tensor::empty(in.sizes(), in.dtype(), in.device());
  cp->all_to_all(recv, in);  // recv[s] = our tokens of head group s
  return recv.permute({1, 0, 2, 3, 4}).reshape({B, Hn * N, 2 * c, D});
}

}  // namespace

Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const dist::CommPtr& cp, bool is_causal, CPComm comm,
                                  std::optional<double> scale) {
  const AttnShape s = check_inputs(q, k, v, cp, comm, scale);
  if (cp->size() == 1) return scaled_dot_product_attention(q, k, v, Tensor(), is_causal, s.scale);
  Tensor qd = q.detach().contiguous(), kd = k.detach().contiguous(), vd = v.detach().contiguous();
  Tensor out;
  if (comm == CPComm::Ring) {
    RingResult f = ring_forward(qd, kd, vd, cp, is_causal, s);
    out = f.out;
    if (needs_grad({q, k, v})) {
      record("ContextParallelRingAttentionBackward", {q, k, v}, {&out},
             [qd, kd, vd, o = out.detach(), lse = f.lse, cp, is_causal, s](const TensorList& g,
                                                                           const auto&) {
               Tensor go = g[0].defined() ? g[0].detach().contiguous() : zeros_like(o);
               auto [dq, dk, dv] = ring_backward(go, qd, kd, vd, o, lse, cp, is_causal, s);
               return TensorList{dq, dk, dv};
             });
    }
    return out;
  }
  // Ulysses: local attention over the whole sequence for this rank's head group.
  Tensor qh = seq_to_heads(qd, cp), kh = seq_to_heads(kd, cp), vh = seq_to_heads(vd, cp);
  AttentionForward f = flash_attention_forward(qh, kh, vh, is_causal, s.scale);
  out = heads_to_seq(f.out, cp);
  if (needs_grad({q, k, v})) {
    record(
        "ContextParallelAllToAllAttentionBackward", {q, k, v}, {&out},
        [qh, kh, vh, oh = f.out, lse = f.lse, cp, is_causal, s](const TensorList& g, const auto&) {
          Tensor go = g[0].defined() ? g[0].detach()
                                     : zeros({oh.size(0), oh.size(1) * cp->size(),
                                              oh.size(2) / cp->size(), oh.size(3)},
                                             TensorOptions{oh.dtype(), oh.device(), false});
          Tensor gh = seq_to_heads(go.contiguous(), cp);
          auto [dq, dk, dv] = flash_attention_backward(gh, qh, kh, vh, oh, lse, is_causal, s.scale);
          return TensorList{heads_to_seq(dq, cp), heads_to_seq(dk, cp), heads_to_seq(dv, cp)};
        });
  }
  return out;
}

Tensor context_parallel_loss_mean(const Tensor& local_mean, const dist::CommPtr& cp) {
  ops::check_defined(local_mean, "context_parallel_loss_mean", "loss");
  TD_CHECK(cp != nullptr, "context_parallel_loss_mean: the cp communicator is null");
  if (cp->size() == 1) return local_mean;
  Tensor out = dist::all_reduce_copy(local_mean, cp, dist::ReduceOp::Avg);
  if (needs_grad({local_mean})) {
    record("ContextParallelLossMeanBackward", {local_mean}, {&out},
           [shape = local_mean.sizes(), dt = local_mean.dtype(), dev = local_mean.device()](
               const TensorList& g, const auto&) {
             return TensorList{g[0].defined() ? g[0].detach()
                                              : zeros(shape, TensorOptions{dt, dev, false})};
           });
  }
  return out;
}

}  // namespace td::parallel
