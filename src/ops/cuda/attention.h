#pragma once
// CUDA side of flash_attention_forward / flash_attention_backward (src/ops/attention.cpp);
// internal. Arguments are already validated by the front-end (shapes, dtypes, Tq <= Tk when
// causal); these check devices and head-dim limits, make inputs contiguous and run cuDNN's fused
// attention where it takes the shape (Note [cuDNN attention]), else Tardelli's own kernels in
// kernels/attention/ (Note [Two attention paths]).
#include <tuple>

#include "tardelli/core/tensor.h"
#include "tardelli/ops/attention.h"

namespace td::cuda_ops {

AttentionForward flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         bool is_causal, float scale);
std::tuple<Tensor, Tensor, Tensor> flash_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out, const Tensor& lse,
                                                            bool is_causal, float scale);

}  // namespace td::cuda_ops
