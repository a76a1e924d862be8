#pragma once
// FP8 linear layers, emulated exactly on any device (TransformerEngine's recipe; the CPU path of
// issue 27, and the reference a cuBLASLt FP8 GEMM must match).
//
// Note [FP8 emulation]: an FP8 tensor is codes q with a per-tensor scale s, representing q / s.
// fp8_fake_quantize(x, f, s) returns exactly those values, fp8(x * s) / s, in fp32: multiplying
// them in fp32 is what an FP8 GEMM with fp32 accumulation computes (up to the accumulation
// order). fp8_linear quantizes its input and weight in E4M3 (forward), the incoming gradient in
// E5M2 (backward: the hybrid recipe) or E4M3 (the e4m3 recipe) and multiplies the quantized
// operands; the gradients flow to x and W as if the quantization were the identity (the
// straight-through rule FP8 training uses: the GEMMs are what is quantized, the master weights and
// activations keep their precision).
//
// Note [FP8 scaling]: a scale maps a tensor's amax (largest |value|) near the format's largest
// value: scale = fp8_max / amax / 2^margin. Current scaling uses this step's amax (an extra pass
// over the tensor before quantizing); delayed scaling (TransformerEngine's default) uses the
// largest amax of the last `history` steps, recorded after each use, so the quantization needs
// no extra pass and one outlier step does not collapse the scale. A zero or non-finite amax
// keeps the previous scale.
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "tardelli/core/fp8.h"
#include "tardelli/core/tensor.h"

namespace td {

// The codes fp8(x * scale) as a float8 tensor on x's device (x * scale computed in float32,
// then rounded as to_fp8 rounds: saturating unless told not to). Not recorded by autograd.
Tensor fp8_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate = true);
// The values float8 codes q stand for with `scale`: q * float(1 / scale) in float32 (exact
// products of an fp8 value and a float, rounded once), converted to `dtype`.
Tensor fp8_dequantize(const Tensor& q, double scale, DType dtype = DType::Float32);
// fp8_dequantize(fp8_quantize(x, format, scale, saturate), scale) (Note [FP8 emulation]).
Tensor fp8_fake_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate = true);

// out [m, n] = Q(a) Q(b)^T + bias, in out_dtype, with Q(t) = fp8_dequantize(t, its scale):
// a [m, k] and b [n, k] hold float8 codes (any strides), bias [n] (optional) is floating, all on
// one device. The products are accumulated in fp32, the bias added, and the sum rounded once to
// out_dtype (the GPU's bias epilogue may round the product to a bf16/fp16 out_dtype before
// adding a bias of that dtype: Note [GEMM tolerances] in tests/ops/cuda). On a GPU with FP8 tensor
// cores, k and n multiples of 16 and not both operands E5M2, it is one cuBLASLt FP8 GEMM (Note [FP8
// GEMM on cuBLASLt] in kernels/gemm/gemm.cuh), which equals the rest's fp32 product of the
// dequantized operands up to summation order; elsewhere (the CPU, sm_80, other shapes) it is that
// product. Not recorded by autograd.
Tensor fp8_scaled_mm(const Tensor& a, double a_scale, const Tensor& b, double b_scale,
                     DType out_dtype, const Tensor& bias = {});
// max |x| as a double (NaN if x holds NaN; 0 for an empty tensor).
double amax(const Tensor& x);
// The same as a 0-d float32 tensor on x's device (no read-back; NaN if x holds NaN).
Tensor amax_tensor(const Tensor& x);

// One tensor's scale (Note [FP8 scaling]).
class Fp8Scaling {
 public:
  // history 0: current scaling; >= 1: delayed over that many recorded amaxes.
  Fp8Scaling(Fp8Format format, int64_t history = 16, double margin = 0.0);
  // The scale to quantize `x` with now (current scaling measures x; delayed uses the history).
  // `reduce` (current scaling of a sharded tensor): turns this rank's amax into the whole
  // tensor's (a max over the ranks holding its shards).
  double scale_for(const Tensor& x, const std::function<double(double)>& reduce = {}) const;
  // Records this step's amax of the quantized tensor (delayed scaling) and updates the scale.
  void record(double amax);
  // Note [Deferred amax]: notes an amax for the next commit() instead of recording it now. The
  // pending value is the max of those noted (a non-finite amax counts as +inf), so noting the
  // same tensor twice (a recomputed forward) changes nothing, and all the uses between two
  // commits (a training step's micro-batches, in any pipeline order) quantize with the same
  // scale. commit() records it (once per step) and clears it; commit(a) records `a` instead
  // (the max of every rank's pending amax: Note [Amax reduction] in parallel/precision_sync.h).
  // Both do nothing when nothing is pending.
  void observe(double amax);
  // The same for an amax still on its device (amax_tensor): kept there, so a training step's
  // forwards and backwards read nothing back; folded into the pending max (one read-back per
  // scaling and step) when pending() or commit() needs it (Note [Deferred amax]).
  void observe(const Tensor& amax);
  // The max noted since the last commit, or -1 when nothing is pending (amaxes are >= 0).
  double pending() const;
  void commit();
  void commit(double amax);
  double scale() const { return scale_; }
  // Restores a saved (scale, history) pair (checkpoints); the history is cut to its length.
  void set_state(double scale, const std::vector<double>& history);
  const std::deque<double>& history() const { return amax_; }
  Fp8Format format() const { return format_; }
  int64_t history_length() const { return history_; }
  // The formula: fp8_max / amax / 2^margin (the previous scale when amax is 0 or not finite).
  double scale_from(double amax, double previous) const;

 private:
  Fp8Format format_;
  int64_t history_;
  double margin_;
  double scale_ = 1.0;
  mutable double pending_ = -1.0;
  mutable std::vector<Tensor> pending_device_;  // 0-d float32 amaxes not yet read back
  std::deque<double> amax_;
};

// The FP8 formats of a linear's three tensors: hybrid (TransformerEngine's default) keeps the
// gradients in E5M2 for their range; e4m3 puts every tensor, the gradients too, in E4M3 (one
// more mantissa bit, 2^-9..448 instead of 2^-16..57344).
enum class Fp8Recipe { Hybrid, E4M3 };
const char* fp8_recipe_name(Fp8Recipe r);
Fp8Recipe parse_fp8_recipe(const std::string& name);  // "hybrid" | "e4m3"; td::Error otherwise

// The scaling state of one FP8 linear layer: input and weight (E4M3), output gradient (E5M2
// under the hybrid recipe, E4M3 under e4m3).
struct Fp8LinearState {
  Fp8Scaling input, weight, grad;
  explicit Fp8LinearState(int64_t history = 16, double margin = 0.0,
                          Fp8Recipe recipe = Fp8Recipe::Hybrid)
      : input(Fp8Format::E4M3FN, history, margin),
        weight(Fp8Format::E4M3FN, history, margin),
        grad(recipe == Fp8Recipe::Hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3FN, history, margin) {}
  // Every scaling's pending amax committed as it is (one rank).
  void commit() {
    input.commit();
    weight.commit();
    grad.commit();
  }
};

// What fp8_linear does with the amaxes of the tensors it quantizes.
enum class Fp8Amax {
  Ignore,   // evaluation: the current scales, nothing recorded
  Record,   // recorded at once (history advances every call)
  Observe,  // noted for a later commit (Note [Deferred amax]; the GPT's training forwards)
};

// How often FP8 quantization clips or flushes (the adaptive precision policy's statistics):
// values counted, values beyond the format's max (saturated), nonzero values rounded to zero.
struct Fp8Counts {
  int64_t values = 0, overflow = 0, underflow = 0;
  void add(const Fp8Counts& o) {
    values += o.values;
    overflow += o.overflow;
    underflow += o.underflow;
  }
};
// The counts of quantizing x with `scale` in `format` (x is not changed).
Fp8Counts fp8_count(const Tensor& x, Fp8Format format, double scale);

// Which of a linear's operands this rank holds only a shard of (tensor parallelism), as
// functions turning this rank's amax into the whole tensor's (a max over the tp group); empty:
// the tensor is whole (or replicated) here. Only current scaling needs them inside the layer:
// delayed amaxes are reduced once per step (Note [Amax reduction]).
struct Fp8Shards {
  std::function<double(double)> input, weight, grad;
};

// y = Q(x) Q(W)^T + b with Q as above (Note [FP8 emulation]); `state` (and `counts`) must
// outlive the backward pass (it notes the gradient's amax there). With `counts`, the
// quantization of x, W and the gradient is counted into it.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  Fp8Amax amaxes = Fp8Amax::Record, const Fp8Shards& shards = {},
                  Fp8Counts* counts = nullptr);

// Identity in forward; in backward, notes the amax of the incoming gradient in `scaling` (which
// must outlive it) and, with `counts`, counts its quantization with the scale fp8_linear would
// use (`reduce` as in Fp8Shards). The adaptive policy puts it on a linear that runs in
// bf16/fp32, so that its FP8 gradient scale stays current and its FP8 statistics are known
// while it is not quantized.
Tensor fp8_observe_grad(const Tensor& y, Fp8Scaling& scaling, Fp8Counts* counts = nullptr,
                        std::function<double(double)> reduce = {});

}  // namespace td
