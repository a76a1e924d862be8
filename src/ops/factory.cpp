#include "tardelli/ops/factory.h"

#include <cmath>

#include "ops/common.h"
#include "ops/cpu/loops.h"
#include "tardelli/ops/copy.h"
#if TD_WITH_CUDA
#include "ops/cuda/copy.h"
#endif

namespace td {

namespace {

// Note [Random tensors on devices]: arange and the random factories fill a CPU tensor and copy
// it to the requested device, so a seed gives the same values on every device (initialization
// is no hot path; dropout draws its masks on the device itself).
Tensor finish(Tensor t, const TensorOptions& o) {
  if (t.device() != o.device) t = to_device(t, o.device);
  if (o.requires_grad) t.set_requires_grad(true);
  return t;
}

template <typename T>
void fill_contiguous(const Tensor& t, T v) {
  T* p = static_cast<T*>(t.data_ptr());
  cpu::parallel_for(t.numel(), cpu::kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = v;
  });
}

// Converts fp32 values drawn by the RNG into the requested dtype.
Tensor from_float_buffer(std::vector<float>& buf, const Shape& sizes, const TensorOptions& o) {
  Tensor f = Tensor::empty(sizes, DType::Float32, kCPU);
  std::copy(buf.begin(), buf.end(), static_cast<float*>(f.data_ptr()));
  Tensor out = to_dtype(f, o.dtype);
  if (out.is_same(f)) out = f;
  return out;
}

}  // namespace

Tensor empty(const Shape& sizes, const TensorOptions& o) {
  return finish(Tensor::empty(sizes, o.dtype, o.device), o);
}

Tensor full(const Shape& sizes, double value, const TensorOptions& o) {
  Tensor t = Tensor::empty(sizes, o.dtype, o.device);
  t.fill_(value);
  return finish(t, o);
}

Tensor zeros(const Shape& sizes, const TensorOptions& o) { return full(sizes, 0.0, o); }
Tensor ones(const Shape& sizes, const TensorOptions& o) { return full(sizes, 1.0, o); }

Tensor arange(double start, double end, double step, const TensorOptions& o) {
  TD_CHECK(step != 0, "arange: step must be nonzero");
  TD_CHECK((end - start) / step >= 0, "arange: range [", start, ", ", end, ") with step ", step,
           " is empty in the wrong direction");
  int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = Tensor::empty({n}, o.dtype, kCPU);
  TD_DISPATCH_NUMERIC(o.dtype, "arange", [&]<typename T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<acc_t<T>>(start + i * step));
  });
  return finish(t, o);
}

Tensor rand(const Shape& sizes, const TensorOptions& o, Generator* gen) {
  TD_CHECK(is_floating(o.dtype), "rand: dtype must be floating, got ", dtype_name(o.dtype));
  Generator& g = gen ? *gen : default_generator();
  int64_t n = numel_of(sizes);
  std::vector<float> buf(n);
  philox_uniform(g.reserve(n), buf.data(), n);
  return finish(from_float_buffer(buf, sizes, o), o);
}

Tensor randn(const Shape& sizes, const TensorOptions& o, Generator* gen) {
  TD_CHECK(is_floating(o.dtype), "randn: dtype must be floating, got ", dtype_name(o.dtype));
  Generator& g = gen ? *gen : default_generator();
  int64_t n = numel_of(sizes);
  std::vector<float> buf(n);
  philox_normal(g.reserve(n), buf.data(), n);
  return finish(from_float_buffer(buf, sizes, o), o);
}

Tensor randint(int64_t low, int64_t high, const Shape& sizes, const TensorOptions& o,
               Generator* gen) {
  TD_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  Generator& g = gen ? *gen : default_generator();
  int64_t n = numel_of(sizes);
  std::vector<float> buf(n);
  PhiloxState st = g.reserve(n);
  Tensor t = Tensor::empty(sizes, o.dtype, kCPU);
  uint64_t range = static_cast<uint64_t>(high - low);
  TD_DISPATCH_NUMERIC(o.dtype, "randint", [&]<typename T>() {
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t b = 0; b < (n + 3) / 4; ++b) {
      uint64_t ctr = st.offset + b;
      auto r = philox4x32({static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                           static_cast<uint32_t>(st.subsequence),
                           static_cast<uint32_t>(st.subsequence >> 32)},
                          {static_cast<uint32_t>(st.seed), static_cast<uint32_t>(st.seed >> 32)});
      for (int l = 0; l < 4 && b * 4 + l < n; ++l) {
        p[b * 4 + l] = static_cast<T>(static_cast<acc_t<T>>(low + static_cast<int64_t>(r[l] % range)));
      }
    }
  });
  return finish(t, o);
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.sizes(), t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), {t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), {t.dtype(), t.device()}); }
Tensor full_like(const Tensor& t, double v) { return full(t.sizes(), v, {t.dtype(), t.device()}); }

Tensor scalar_tensor(double value, DType dtype, Device device) {
  return full({}, value, {dtype, device});
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes) {
  TD_CHECK(static_cast<int64_t>(values.size()) == numel_of(sizes), "from_vector: ",
           values.size(), " values for shape ", shape_str(sizes));
  Tensor t = Tensor::empty(sizes, dtype_of<T>::value, kCPU);
  std::copy(values.begin(), values.end(), static_cast<T*>(t.data_ptr()));
  return t;
}

template <typename T>
std::vector<T> to_vector(const Tensor& t) {
  TD_CHECK(t.defined(), "to_vector: undefined tensor");
  Tensor c = Tensor::empty(t.sizes(), dtype_of<T>::value, kCPU);
  copy_into(c, t.is_cpu() ? t : t.to(kCPU));
  const T* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}

#define TD_INSTANTIATE_VECTOR(T)                                              \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&); \
  template std::vector<T> to_vector<T>(const Tensor&);
TD_INSTANTIATE_VECTOR(float)
TD_INSTANTIATE_VECTOR(int32_t)
TD_INSTANTIATE_VECTOR(int64_t)
TD_INSTANTIATE_VECTOR(BFloat16)
TD_INSTANTIATE_VECTOR(Float16)
#undef TD_INSTANTIATE_VECTOR

template <>
Tensor from_vector<bool>(const std::vector<bool>& values, const Shape& sizes) {
  TD_CHECK(static_cast<int64_t>(values.size()) == numel_of(sizes), "from_vector: ",
           values.size(), " values for shape ", shape_str(sizes));
  Tensor t = Tensor::empty(sizes, DType::Bool, kCPU);
  bool* p = static_cast<bool*>(t.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

// fill_ lives here with the other initializers.
Tensor& Tensor::fill_(double value) {
  TD_CHECK(defined(), "fill_: undefined tensor");
#if TD_WITH_CUDA
  if (is_cuda()) {
    cuda_ops::fill_(*this, value);
    return *this;
  }
#endif
  ops::check_cpu(*this, "fill_");
  TD_DISPATCH_ALL_AND_FLOAT8(dtype(), "fill_", [&]<typename T>() {
    T v = static_cast<T>(static_cast<acc_t<T>>(value));
    if (is_contiguous()) {
      fill_contiguous<T>(*this, v);
    } else {
      Tensor src = Tensor::empty({}, dtype(), kCPU);
      *static_cast<T*>(src.data_ptr()) = v;
      copy_into(*this, src);
    }
  });
  return *this;
}

}  // namespace td
