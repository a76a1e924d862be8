#include "tardelli/distributed/collectives.h"

#include <cstring>

#include "ops/common.h"
#include "tardelli/autograd/function.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {

using autograd::needs_grad;
using autograd::record;

namespace {

void check_args(const Tensor& x, const CommPtr& comm, const char* op) {
  ops::check_defined(x, op, "input");
  TD_CHECK(comm != nullptr, op, ": the communicator is null");
}

// The dim in [0, x.dim()) that `dim` names (negative counts from the end).
int64_t wrap_dim(const Tensor& x, int64_t dim, const char* op) {
  TD_CHECK(x.dim() >= 1, op, ": expected a tensor with at least one dim, got ", describe(x));
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  TD_CHECK(d >= 0 && d < x.dim(), op, ": dim ", dim, " out of range for ", describe(x));
  return d;
}

void check_divisible(const Tensor& x, int64_t d, const CommPtr& comm, const char* op) {
  TD_CHECK(x.size(d) % comm->size() == 0, op, ": size ", x.size(d), " of dim ", d, " of ",
           describe(x), " is not divisible by the size ", comm->size(), " of group '", comm->name(),
           "'");
}

// The gradient flowing into a one-output node; zeros when none arrived.
Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DType dtype, Device device) {
  return g.defined() ? g.detach() : zeros(shape, TensorOptions{dtype, device, false});
}

}  // namespace

// ---- raw collectives (no autograd) ----

Tensor all_reduce_copy(const Tensor& x, const CommPtr& comm, ReduceOp op) {
  check_args(x, comm, "all_reduce");
  Tensor t = x.detach().clone();
  comm->all_reduce(t, op);
  return t;
}

Tensor all_gather_along(const Tensor& x, const CommPtr& comm, int64_t dim) {
  const char* op = "all_gather_along";
  check_args(x, comm, op);
  const int64_t d = wrap_dim(x, dim, op);
  const int64_t n = comm->size();
  Tensor in = x.detach().contiguous();
  Shape stacked = {n};
  stacked.insert(stacked.end(), in.sizes().begin(), in.sizes().end());
  Tensor out = Tensor::empty(stacked, in.dtype(), in.device());
  comm->all_gather(out, in);
  Shape result = in.sizes();
  result[d] *= n;
  if (d == 0) return out.view(result);
  // Note [Gathers along an inner dim]: [n, s0, .., sd, ..] -> [s0, .., n, sd, ..].
  Shape perm;
  for (int64_t i = 1; i <= d; ++i) perm.push_back(i);
  perm.push_back(0);
  for (int64_t i = d + 1; i <= in.dim(); ++i) perm.push_back(i);
  return out.permute(perm).contiguous().view(result);
}

Tensor reduce_scatter_along(const Tensor& x, const CommPtr& comm, int64_t dim, ReduceOp op) {
  const char* name = "reduce_scatter_along";
  check_args(x, comm, name);
  const int64_t d = wrap_dim(x, dim, name);
  check_divisible(x, d, comm, name);
  const int64_t n = comm->size();
  Tensor in = x.detach();
  Shape chunk = in.sizes();
  chunk[d] /= n;
  // [s0, .., n, sd / n, ..] -> [n, s0, .., sd / n, ..]: chunk i becomes the i-th flat block.
  Shape split = in.sizes();
  split[d] = chunk[d];
  split.insert(split.begin() + d, n);
  Tensor blocks = in.reshape(split);
  if (d > 0) {
    Shape perm = {d};
    for (int64_t i = 0; i < static_cast<int64_t>(split.size()); ++i)
      if (i != d) perm.push_back(i);
    blocks = blocks.permute(perm);
  }
  blocks = blocks.contiguous();
  Tensor out = Tensor::empty(chunk, in.dtype(), in.device());
  comm->reduce_scatter(out, blocks, op);
  return out;
}

Tensor chunk_along(const Tensor& x, const CommPtr& comm, int64_t dim) {
  const char* op = "chunk_along";
  check_args(x, comm, op);
  const int64_t d = wrap_dim(x, dim, op);
  check_divisible(x, d, comm, op);
  const int64_t k = x.size(d) / comm->size();
  return x.detach().narrow(d, comm->rank() * k, k).contiguous();
}

// ---- autograd collectives ----
// Each records one node whose backward is the dual collective on the incoming gradient. A group
// of size 1 returns x itself (nothing to communicate, nothing to record).

Tensor copy_to_region(const Tensor& x, const CommPtr& comm) {
  check_args(x, comm, "copy_to_region");
  if (comm->size() == 1) return x;
  Tensor out = x.detach();  // identity: shares x's storage, like a view
  if (needs_grad({x})) {
    record("CopyToRegionBackward", {x}, {&out},
           [comm, shape = x.sizes(), dt = x.dtype(), dev = x.device()](const TensorList& g,
                                                                       const auto&) {
             return TensorList{all_reduce_copy(grad_or_zeros(g[0], shape, dt, dev), comm)};
           });
  }
  return out;
}

Tensor reduce_from_region(const Tensor& x, const CommPtr& comm) {
  check_args(x, comm, "reduce_from_region");
  if (comm->size() == 1) return x;
  Tensor out = all_reduce_copy(x, comm);
  if (needs_grad({x})) {
    record("ReduceFromRegionBackward", {x}, {&out},
           [shape = x.sizes(), dt = x.dtype(), dev = x.device()](const TensorList& g, const auto&) {
             return TensorList{grad_or_zeros(g[0], shape, dt, dev)};
           });
  }
  return out;
}

Tensor scatter_to_region(const Tensor& x, const CommPtr& comm, int64_t dim) {
  check_args(x, comm, "scatter_to_region");
  const int64_t d = wrap_dim(x, dim, "scatter_to_region");
  check_divisible(x, d, comm, "scatter_to_region");
  if (comm->size() == 1) return x;
  Tensor out = chunk_along(x, comm, d);
  if (needs_grad({x})) {
    record("ScatterToRegionBackward", {x}, {&out},
           [comm, d, shape = out.sizes(), dt = x.dtype(), dev = x.device()](const TensorList& g,
                                                                            const auto&) {
             return TensorList{all_gather_along(grad_or_zeros(g[0], shape, dt, dev), comm, d)};
           });
  }
  return out;
}

Tensor gather_from_region(const Tensor& x, const CommPtr& comm, int64_t dim) {
  check_args(x, comm, "gather_from_region");
  const int64_t d = wrap_dim(x, dim, "gather_from_region");
  if (comm->size() == 1) return x;
  Tensor out = all_gather_along(x, comm, d);
  if (needs_grad({x})) {
    record("GatherFromRegionBackward", {x}, {&out},
           [comm, d, shape = out.sizes(), dt = x.dtype(), dev = x.device()](const TensorList& g,
                                                                            const auto&) {
             return TensorList{chunk_along(grad_or_zeros(g[0], shape, dt, dev), comm, d)};
           });
  }
  return out;
}

Tensor reduce_scatter_to_sequence(const Tensor& x, const CommPtr& comm, int64_t dim) {
  check_args(x, comm, "reduce_scatter_to_sequence");
  const int64_t d = wrap_dim(x, dim, "reduce_scatter_to_sequence");
  check_divisible(x, d, comm, "reduce_scatter_to_sequence");
  if (comm->size() == 1) return x;
  Tensor out = reduce_scatter_along(x, comm, d);
  if (needs_grad({x})) {
    record("ReduceScatterToSequenceBackward", {x}, {&out},
           [comm, d, shape = out.sizes(), dt = x.dtype(), dev = x.device()](const TensorList& g,
                                                                            const auto&) {
             return TensorList{all_gather_along(grad_or_zeros(g[0], shape, dt, dev), comm, d)};
           });
  }
  return out;
}

Tensor gather_from_sequence(const Tensor& x, const CommPtr& comm, int64_t dim,
                            bool tp_output_grad) {
  check_args(x, comm, "gather_from_sequence");
  const int64_t d = wrap_dim(x, dim, "gather_from_sequence");
  if (comm->size() == 1) return x;
  Tensor out = all_gather_along(x, comm, d);
  if (needs_grad({x})) {
    record("GatherFromSequenceBackward", {x}, {&out},
           [comm, d, tp_output_grad, shape = out.sizes(), dt = x.dtype(), dev = x.device()](
               const TensorList& g, const auto&) {
             Tensor go = grad_or_zeros(g[0], shape, dt, dev);
             return TensorList{tp_output_grad ? reduce_scatter_along(go, comm, d)
                                              : chunk_along(go, comm, d)};
           });
  }
  return out;
}

namespace {

Tensor rows_exchange(const Tensor& x, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows, const CommPtr& comm) {
  const int64_t row = x.dim() > 1 ? x.numel() / std::max<int64_t>(1, x.size(0)) : 1;
  int64_t out_rows = 0;
  std::vector<int64_t> in_splits, out_splits;
  for (size_t j = 0; j < send_rows.size(); ++j) {
    in_splits.push_back(send_rows[j] * row);
    out_splits.push_back(recv_rows[j] * row);
    out_rows += recv_rows[j];
  }
  Shape shape = x.sizes();
  shape[0] = out_rows;
  Tensor out = empty(shape, {x.dtype(), x.device()});
  Tensor in = x.detach().contiguous();
  comm->all_to_all(out, in, out_splits, in_splits);
  return out;
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, const CommPtr& comm) {
  check_args(x, comm, "all_to_all_rows");
  const size_t n = static_cast<size_t>(comm->size());
  TD_CHECK(x.dim() >= 1, "all_to_all_rows: x must have a row dim, got ", describe(x));
  TD_CHECK(send_rows.size() == n && recv_rows.size() == n, "all_to_all_rows: ", send_rows.size(),
           " send and ", recv_rows.size(), " receive counts for a group of ", n, " (rank ",
           comm->rank(), ")");
  int64_t total = 0;
  for (size_t j = 0; j < n; ++j) {
    TD_CHECK(send_rows[j] >= 0 && recv_rows[j] >= 0,
             "all_to_all_rows: negative row count for rank ", j, " (rank ", comm->rank(), ")");
    total += send_rows[j];
  }
  TD_CHECK(total == x.size(0), "all_to_all_rows: the send counts add up to ", total,
           " rows but x is ", describe(x), " (rank ", comm->rank(), ")");
  if (n == 1) return x;
  Tensor out = rows_exchange(x, send_rows, recv_rows, comm);
  if (needs_grad({x})) {
    record("AllToAllRowsBackward", {x}, {&out},
           [comm, send_rows, recv_rows, oshape = out.sizes(), dt = x.dtype(), dev = x.device()](
               const TensorList& g, const auto&) {
             Tensor go = grad_or_zeros(g[0], oshape, dt, dev);
             return TensorList{rows_exchange(go, recv_rows, send_rows, comm)};
           });
  }
  return out;
}

std::vector<std::vector<int64_t>> exchange_counts(const std::vector<int64_t>& mine,
                                                  const CommPtr& comm) {
  TD_CHECK(comm != nullptr, "exchange_counts: the communicator is null");
  const int64_t n = comm->size(), m = static_cast<int64_t>(mine.size());
  Tensor in = from_vector<int64_t>(mine, {m});
  Tensor all = empty({n * m}, {DType::Int64});
  comm->all_gather(all, in);
  const std::vector<int64_t> flat = to_vector<int64_t>(all);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[j].assign(flat.begin() + j * m, flat.begin() + (j + 1) * m);
  return out;
}

double sum_over_ranks(double local, const CommPtr& comm) {
  TD_CHECK(comm != nullptr, "sum_over_ranks: the communicator is null");
  Tensor in = empty({1}, {DType::Int64});
  std::memcpy(in.data_ptr<int64_t>(), &local, sizeof(double));
  Tensor all = empty({comm->size()}, {DType::Int64});
  comm->all_gather(all, in);
  double total = 0;
  for (int64_t r = 0; r < comm->size(); ++r) {
    double x;
    std::memcpy(&x, all.data_ptr<int64_t>() + r, sizeof(double));
    total += x;
  }
  return total;
}

}  // namespace td::distributed
