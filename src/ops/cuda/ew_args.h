#pragma once
// Tensors -> the elementwise engine's geometry (kernels/elementwise/elementwise.cuh); internal,
// CUDA builds only.
#include <initializer_list>

#include "elementwise/elementwise.cuh"
#include "tardelli/core/tensor.h"

namespace td::cuda_ops {

kernels::EwType ew_type(DType t);
// Operand 0 (the output) defines the shape; the others are broadcast to it. Size-1 dims are
// dropped and dims contiguous for every operand merged (Note [Elementwise geometry]). A
// td::Error naming `op` if more than kernels::kEwMaxDims dims remain.
kernels::EwArgs make_ew_args(const char* op, std::initializer_list<const Tensor*> operands);

}  // namespace td::cuda_ops
