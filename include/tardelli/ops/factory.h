#pragma once
// Tensor creation. Random factories draw from a td::Generator (the default one unless given).
#include <vector>

#include "tardelli/core/rng.h"
#include "tardelli/core/tensor.h"

namespace td {

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = kCPU;
  bool requires_grad = false;
};

Tensor empty(const Shape& sizes, const TensorOptions& o = {});
Tensor zeros(const Shape& sizes, const TensorOptions& o = {});
Tensor ones(const Shape& sizes, const TensorOptions& o = {});
Tensor full(const Shape& sizes, double value, const TensorOptions& o = {});
// [start, end) with step, like torch.arange; dtype int64 unless options say otherwise.
Tensor arange(double start, double end, double step = 1.0,
              const TensorOptions& o = {DType::Int64, kCPU, false});
Tensor rand(const Shape& sizes, const TensorOptions& o = {}, Generator* gen = nullptr);
Tensor randn(const Shape& sizes, const TensorOptions& o = {}, Generator* gen = nullptr);
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& sizes,
               const TensorOptions& o = {DType::Int64, kCPU, false}, Generator* gen = nullptr);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, DType dtype = DType::Float32, Device device = kCPU);

// Copies host values into a new CPU tensor of dtype_of<T> (or `as` when given).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes);
template <typename T>
std::vector<T> to_vector(const Tensor& t);  // converts to T, any layout

}  // namespace td
