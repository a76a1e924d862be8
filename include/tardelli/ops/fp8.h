#pragma once
// FP8 linear layers, emulated exactly on any device (TransformerEngine's recipe; the CPU path of
// issue 27, and the reference a cuBLASLt FP8 GEMM must match).
//
// Note [FP8 emulation]: an FP8 tensor is codes q with a per-tensor scale s, representing q / s.
// fp8_fake_quantize(x, f, s) returns exactly those values, fp8(x * s) / s, in fp32: multiplying
// them in fp32 is what an FP8 GEMM with fp32 accumulation computes (up to the accumulation
// order). fp8_linear quantizes its input and weight in E4M3 (forward), the incoming gradient in
// E5M2 (backward: the hybrid format) and multiplies the quantized operands; the gradients flow
// to x and W as if the quantization were the identity (the straight-through rule FP8 training
// uses: the GEMMs are what is quantized, the master weights and activations keep their
// precision).
//
// Note [FP8 scaling]: a scale maps a tensor's amax (largest |value|) near the format's largest
// value: scale = fp8_max / amax / 2^margin. Current scaling uses this step's amax (an extra pass
// over the tensor before quantizing); delayed scaling (TransformerEngine's default) uses the
// largest amax of the last `history` steps, recorded after each use, so the quantization needs
// no extra pass and one outlier step does not collapse the scale. A zero or non-finite amax
// keeps the previous scale.
#include <cstdint>
#include <deque>
#include <vector>

#include "tardelli/core/fp8.h"
#include "tardelli/core/tensor.h"

namespace td {

// fp8(x * scale) / scale in float32 (Note [FP8 emulation]); saturate as fp8_from_float. Not
// recorded by autograd.
Tensor fp8_fake_quantize(const Tensor& x, Fp8Format format, double scale, bool saturate = true);
// max |x| as a double (NaN if x holds NaN; 0 for an empty tensor).
double amax(const Tensor& x);

// One tensor's scale (Note [FP8 scaling]).
class Fp8Scaling {
 public:
  // history 0: current scaling; >= 1: delayed over that many recorded amaxes.
  Fp8Scaling(Fp8Format format, int64_t history = 16, double margin = 0.0);
  // The scale to quantize `x` with now (current scaling measures x; delayed uses the history).
  double scale_for(const Tensor& x) const;
  // Records this step's amax of the quantized tensor (delayed scaling) and updates the scale.
  void record(double amax);
  double scale() const { return scale_; }
  // Restores a saved (scale, history) pair (checkpoints); the history is cut to its length.
  void set_state(double scale, const std::vector<double>& history);
  const std::deque<double>& history() const { return amax_; }
  Fp8Format format() const { return format_; }
  // The formula: fp8_max / amax / 2^margin (the previous scale when amax is 0 or not finite).
  double scale_from(double amax, double previous) const;

 private:
  Fp8Format format_;
  int64_t history_;
  double margin_;
  double scale_ = 1.0;
  std::deque<double> amax_;
};

// The scaling state of one FP8 linear layer: input and weight (E4M3), output gradient (E5M2).
struct Fp8LinearState {
  Fp8Scaling input, weight, grad;
  explicit Fp8LinearState(int64_t history = 16, double margin = 0.0)
      : input(Fp8Format::E4M3FN, history, margin),
        weight(Fp8Format::E4M3FN, history, margin),
        grad(Fp8Format::E5M2, history, margin) {}
};

// y = Q(x) Q(W)^T + b with Q as above (Note [FP8 emulation]); `state` must outlive the
// backward pass (it records the gradient's amax there). record = false (evaluation): the
// current scales are used and no amax is recorded.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  bool record = true);

}  // namespace td
