#if TD_WITH_CUDA
#include "ops/cuda/loss.h"

#include "loss/cross_entropy.cuh"
#include "ops/cuda/launch.h"
#include "runtime/cuda_check.cuh"
#include "runtime/deferred_checks.cuh"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/ops/copy.h"

namespace td::cuda_ops {

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                             Reduction reduction, double label_smoothing, const Shape& batch,
                             Tensor& target64, Tensor& shift, Tensor& log_s, int64_t& count,
                             bool deferred) {
  const char* op = "cross_entropy";
  check_same_cuda_device(op, logits, {&target});
  OnDevice on(logits);
  const Tensor lc = contiguous_of(logits.detach());
  const int64_t rows = lc.size(0), C = lc.size(1);
  target64 = Tensor::empty({rows}, DType::Int64, lc.device());
  if (rows > 0) copy_into(target64, target.detach().reshape({rows}));
  shift = Tensor::empty({rows}, DType::Float32, lc.device());
  log_s = Tensor::empty({rows}, DType::Float32, lc.device());
  Tensor loss = Tensor::empty({rows}, DType::Float32, lc.device());
  Tensor totals = scratch_bytes(lc, sizeof(kernels::CrossEntropyTotals));
  auto* totals_dev = static_cast<kernels::CrossEntropyTotals*>(totals.data_ptr());
  Tensor out = reduction == Reduction::None ? Tensor() : Tensor::empty({}, lc.dtype(), lc.device());
  TD_DISPATCH_FLOATING(lc.dtype(), op, [&]<typename T>() {
    const cudaStream_t stream = stream_of(lc);
    kernels::cross_entropy_forward<cuda_t<T>>(ptr<T>(lc), target64.data_ptr<int64_t>(), rows, C,
                                              ignore_index, static_cast<float>(label_smoothing),
                                              loss.data_ptr<float>(), shift.data_ptr<float>(),
                                              log_s.data_ptr<float>(), stream);
    kernels::cross_entropy_reduce<cuda_t<T>>(loss.data_ptr<float>(), target64.data_ptr<int64_t>(),
                                             rows, C, ignore_index, reduction == Reduction::Mean,
                                             ptr_or_null<T>(out), totals_dev, stream);
  });
  auto message = [C, ignore_index, op](const kernels::CrossEntropyTotals& t) -> std::string {
    if (t.bad_row < 0) return "";
    return detail::str_cat(op, ": target ", t.bad_target, " at position ", t.bad_row,
                           " is out of range for ", C, " classes (valid: 0..", C - 1,
                           ", or ignore_index ", ignore_index, ")");
  };
  if (deferred) {
    count = -1;
    cuda::defer_check(cuda::current_stream(lc.device().index), [totals, message]() {
      kernels::CrossEntropyTotals host{};
      TD_CUDA_CHECK(cudaMemcpy(&host, totals.data_ptr(), sizeof(host), cudaMemcpyDeviceToHost));
      return message(host);
    });
  } else {
    kernels::CrossEntropyTotals host{};
    copy_bytes(&host, kCPU, totals_dev, lc.device(), sizeof(host));
    const std::string bad = message(host);
    TD_CHECK(bad.empty(), bad);
    count = host.count;
  }
  if (reduction == Reduction::None) {
    out = loss.view(batch);
    if (lc.dtype() != DType::Float32) out = to_dtype(out, lc.dtype());
  }
  return out;
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target64,
                              const Tensor& shift, const Tensor& log_s, int64_t count,
                              int64_t ignore_index, Reduction reduction, double label_smoothing,
                              const Shape& logits_shape) {
  const char* op = "cross_entropy_backward";
  check_same_cuda_device(op, logits, {&grad, &target64, &shift, &log_s});
  OnDevice on(logits);
  const int64_t rows = logits.size(0), C = logits.size(1);
  Tensor g = grad.detach();
  if (g.dtype() != DType::Float32) g = to_dtype(g, DType::Float32);
  g = contiguous_of(g);
  const bool g_scalar = reduction != Reduction::None;
  TD_CHECK(g.numel() == (g_scalar ? 1 : rows), op, ": grad ", describe(grad),
           " does not match the loss");
  // Mean over zero rows: every row is ignored, so nothing reads the (infinite) scale.
  const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(count) : 1.0;
  Tensor dx = Tensor::empty(logits_shape, logits.dtype(), logits.device());
  if (rows == 0) return dx;
  TD_DISPATCH_FLOATING(logits.dtype(), op, [&]<typename T>() {
    kernels::cross_entropy_backward<cuda_t<T>>(
        ptr<T>(logits), target64.data_ptr<int64_t>(), shift.data_ptr<float>(),
        log_s.data_ptr<float>(), g.data_ptr<float>(), g_scalar, scale, rows, C, ignore_index,
        static_cast<float>(label_smoothing), ptr<T>(dx), stream_of(logits));
  });
  return dx;
}

}  // namespace td::cuda_ops
#endif  // TD_WITH_CUDA
