#include "tardelli/distributed/grad_compression.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/core/rng.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/view.h"

namespace td::distributed {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The residual of parameter `name` ([numel] fp32 on `like`'s device), created at zero.
Tensor& residual(std::map<std::string, Tensor>& err, const std::string& name, int64_t numel,
                 const Tensor& like) {
  auto it = err.find(name);
  if (it == err.end())
    it = err.emplace(name, zeros({numel}, {DType::Float32, like.device()})).first;
  TD_CHECK(it->second.numel() == numel, "gradient compression: the residual of '", name, "' has ",
           it->second.numel(), " elements, the parameter ", numel);
  return it->second;
}

// `key` without `suffix` when it ends with it (and has something before it), else nullopt.
std::optional<std::string> strip_suffix(const std::string& key, const std::string& suffix) {
  if (key.size() <= suffix.size() ||
      key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  return key.substr(0, key.size() - suffix.size());
}

void load_into(std::map<std::string, Tensor>& mine, const std::map<std::string, Tensor>& in) {
  autograd::NoGradGuard ng;
  for (const auto& [k, v] : in) {
    auto it = mine.find(k);
    if (it == mine.end() || it->second.sizes() != v.sizes()) {
      mine[k] = v.to(DType::Float32).contiguous().clone();
    } else {
      copy_into(it->second, v);
    }
  }
}

// Gram-Schmidt on the columns of a contiguous fp32 CPU matrix [rows, r], in place; a column
// that becomes (numerically) zero is set to zero.
void orthonormalize(Tensor& p) {
  const int64_t rows = p.size(0), r = p.size(1);
  float* a = p.data_ptr<float>();
  for (int64_t j = 0; j < r; ++j) {
    for (int64_t k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += double(a[i * r + j]) * a[i * r + k];
      for (int64_t i = 0; i < rows; ++i) a[i * r + j] -= static_cast<float>(dot) * a[i * r + k];
    }
    double nn = 0;
    for (int64_t i = 0; i < rows; ++i) nn += double(a[i * r + j]) * a[i * r + j];
    const double n = std::sqrt(nn);
    const float inv = n > 1e-20 ? static_cast<float>(1.0 / n) : 0.0f;
    for (int64_t i = 0; i < rows; ++i) a[i * r + j] *= inv;
  }
}

// Note [PowerSGD].
class PowerSGD final : public GradCompressor {
 public:
  PowerSGD(int64_t rank, uint64_t seed) : rank_(rank), seed_(seed) {
    TD_CHECK(rank >= 1, "PowerSGD: the rank must be >= 1, got ", rank);
  }

  std::string name() const override { return "powersgd"; }

  void compress_reduce(size_t /*bucket*/, Tensor& buffer,
                       const std::vector<CompressedParam>& params, const CommPtr& comm,
                       bool average) override {
    autograd::NoGradGuard ng;
    const double scale = average ? 1.0 / comm->size() : 1.0;
    std::vector<const CompressedParam*> mats, vecs;
    for (const auto& p : params) (p.shape.size() >= 2 ? mats : vecs).push_back(&p);
    // Vectors: one uncompressed all-reduce.
    if (!vecs.empty()) {
      TensorList parts;
      for (const auto* p : vecs) parts.push_back(buffer.narrow(0, p->offset, p->numel));
      Tensor flat = cat(parts, 0);
      comm->all_reduce(flat, ReduceOp::Sum);
      if (scale != 1.0) mul_(flat, scale);
      int64_t o = 0;
      for (const auto* p : vecs) {
        Tensor dst = buffer.narrow(0, p->offset, p->numel);
        copy_into(dst, flat.narrow(0, o, p->numel));
        o += p->numel;
      }
      sent_ += flat.numel();
    }
    if (mats.empty()) return;
    // M = g + e per matrix; P = M Q.
    std::vector<Tensor> ms, ps, qs;
    for (const auto* p : mats) {
      const int64_t rows = p->shape[0], cols = p->numel / rows;
      TD_CHECK(rank_ <= std::min(rows, cols), "PowerSGD: rank ", rank_,
               " exceeds a dimension of parameter '", p->name, "' ", shape_str(p->shape),
               " (as a [", rows, ", ", cols,
               "] matrix); use --powersgd-rank <= ", std::min(rows, cols));
      Tensor& e = residual(err_, p->name, p->numel, buffer);
      Tensor m = add(buffer.narrow(0, p->offset, p->numel), e).view({rows, cols});
      Tensor& q = warm_q(p->name, cols, buffer);
      ms.push_back(m);
      ps.push_back(mm(m, q));
    }
    Tensor pflat = all_reduce_concat(ps, comm, scale);
    split_into(pflat, ps);
    for (Tensor& p : ps) {
      Tensor host = p.to(kCPU).contiguous().clone();
      orthonormalize(host);
      p = host.to(p.device());
    }
    for (size_t i = 0; i < mats.size(); ++i) qs.push_back(mm(transpose(ms[i], 0, 1), ps[i]));
    Tensor qflat = all_reduce_concat(qs, comm, scale);
    split_into(qflat, qs);
    for (size_t i = 0; i < mats.size(); ++i) {
      const CompressedParam& p = *mats[i];
      Tensor approx = mm(ps[i], transpose(qs[i], 0, 1)).contiguous();  // [rows, cols]
      // e_i = D_i - D': the local matrix minus the applied mean (Note [Error feedback]).
      Tensor& e = err_[p.name];
      copy_into(e, sub(ms[i], approx).reshape({p.numel}));
      Tensor dst = buffer.narrow(0, p.offset, p.numel);
      copy_into(dst, approx.reshape({p.numel}));
      copy_into(q_[p.name], qs[i]);  // warm start for the next step
    }
    sent_ += pflat.numel() + qflat.numel();
    for (const auto* p : mats) dense_ += p->numel;
    for (const auto* p : vecs) dense_ += p->numel;
  }

  std::map<std::string, Tensor> state() const override {
    std::map<std::string, Tensor> out;
    for (const auto& [k, v] : err_) out[k + ".powersgd_error"] = v;
    for (const auto& [k, v] : q_) out[k + ".powersgd_q"] = v;
    return out;
  }

  void load_state(const std::map<std::string, Tensor>& state) override {
    std::map<std::string, Tensor> e, q;
    for (const auto& [k, v] : state) {
      if (auto n = strip_suffix(k, ".powersgd_error")) {
        e[*n] = v;
      } else if (auto m = strip_suffix(k, ".powersgd_q")) {
        q[*m] = v;
      } else {
        TD_ERROR("PowerSGD.load_state: unexpected state '", k, "'");
      }
    }
    load_into(err_, e);
    load_into(q_, q);
  }

 private:
  Tensor& warm_q(const std::string& name, int64_t cols, const Tensor& like) {
    auto it = q_.find(name);
    if (it == q_.end()) {
      Generator g(seed_ ^ fnv1a(name));  // the same on every rank
      it = q_.emplace(name, randn({cols, rank_}, {}, &g).to(like.device())).first;
    }
    TD_CHECK(it->second.size(0) == cols && it->second.size(1) == rank_,
             "PowerSGD: the warm-start Q of '", name, "' is ", describe(it->second), ", expected [",
             cols, ", ", rank_, "]");
    return it->second;
  }

  static Tensor all_reduce_concat(const std::vector<Tensor>& ts, const CommPtr& comm,
                                  double scale) {
    TensorList parts;
    for (const Tensor& t : ts) parts.push_back(t.reshape({t.numel()}));
    Tensor flat = cat(parts, 0).contiguous();
    comm->all_reduce(flat, ReduceOp::Sum);
    if (scale != 1.0) mul_(flat, scale);
    return flat;
  }

  static void split_into(const Tensor& flat, std::vector<Tensor>& ts) {
    int64_t o = 0;
    for (Tensor& t : ts) {
      t = flat.narrow(0, o, t.numel()).view(t.sizes()).contiguous();
      o += t.numel();
    }
  }

  int64_t rank_;
  uint64_t seed_;
  std::map<std::string, Tensor> err_, q_;
};

// Note [Top-k].
class TopK final : public GradCompressor {
 public:
  TopK(double ratio, bool random, uint64_t seed) : ratio_(ratio), random_(random), seed_(seed) {
    TD_CHECK(ratio > 0.0 && ratio <= 1.0, random ? "random-k" : "top-k", ": the ratio must be in ",
             "(0, 1], got ", ratio);
  }

  std::string name() const override { return random_ ? "randomk" : "topk"; }

  void compress_reduce(size_t /*bucket*/, Tensor& buffer,
                       const std::vector<CompressedParam>& params, const CommPtr& comm,
                       bool average) override {
    autograd::NoGradGuard ng;
    const int64_t n = buffer.numel();
    // D = g + e (bucket order), on the host.
    Tensor d = buffer.to(kCPU).contiguous().clone();
    for (const auto& p : params) {
      Tensor& e = residual(err_, p.name, p.numel, d);
      Tensor seg = d.narrow(0, p.offset, p.numel);
      add_(seg, e);
    }
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio_ * n)));
    std::vector<int64_t> idx = select(d, k, comm->rank());
    const float* dv = d.data_ptr<float>();
    std::vector<float> vals(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) vals[j] = dv[idx[j]];
    Tensor my_idx = from_vector<int64_t>(idx, {k}), my_val = from_vector<float>(vals, {k});
    const int P = comm->size();
    Tensor all_idx = Tensor::empty({P * k}, DType::Int64, kCPU);
    Tensor all_val = Tensor::empty({P * k}, DType::Float32, kCPU);
    comm->all_gather(all_idx, my_idx);
    comm->all_gather(all_val, my_val);
    // The mean: every rank's sent entries summed (in rank order), over P.
    std::vector<float> mean(static_cast<size_t>(n), 0.0f);
    const int64_t* ai = all_idx.data_ptr<int64_t>();
    const float* av = all_val.data_ptr<float>();
    for (int64_t j = 0; j < P * k; ++j) mean[static_cast<size_t>(ai[j])] += av[j];
    if (average) {
      const float s = 1.0f / static_cast<float>(P);
      for (float& x : mean) x *= s;
    }
    // e_i = D_i with the sent entries zeroed (Note [Error feedback]).
    float* dw = d.data_ptr<float>();
    for (int64_t j : idx) dw[j] = 0.0f;
    for (const auto& p : params) copy_into(err_[p.name], d.narrow(0, p.offset, p.numel));
    copy_into(buffer, from_vector<float>(mean, {n}).to(buffer.device()));
    sent_ += 2 * k;  // an index and a value per entry
    dense_ += n;
    ++calls_;
  }

  std::map<std::string, Tensor> state() const override {
    std::map<std::string, Tensor> out;
    for (const auto& [k, v] : err_) out[k + ".topk_error"] = v;
    out["topk.calls"] = full({1}, static_cast<double>(calls_), {DType::Int64});
    return out;
  }

  void load_state(const std::map<std::string, Tensor>& state) override {
    std::map<std::string, Tensor> e;
    for (const auto& [k, v] : state) {
      if (k == "topk.calls") {
        calls_ = static_cast<int64_t>(std::llround(v.item_double()));
      } else if (auto n = strip_suffix(k, ".topk_error")) {
        e[*n] = v;
      } else {
        TD_ERROR(name(), ".load_state: unexpected state '", k, "'");
      }
    }
    load_into(err_, e);
  }

 private:
  // k indices of d: the largest |d| (ties: the lower index), or k uniform distinct ones;
  // ascending.
  std::vector<int64_t> select(const Tensor& d, int64_t k, int rank) const {
    const int64_t n = d.numel();
    std::vector<int64_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    if (random_) {
      std::mt19937_64 g(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 1000003ull +
                        static_cast<uint64_t>(calls_));
      for (int64_t j = 0; j < k; ++j) {
        std::uniform_int_distribution<int64_t> u(j, n - 1);
        std::swap(ids[static_cast<size_t>(j)], ids[static_cast<size_t>(u(g))]);
      }
    } else {
      const float* v = d.data_ptr<float>();
      const auto bigger = [v](int64_t a, int64_t b) {
        const float x = std::fabs(v[a]), y = std::fabs(v[b]);
        return x > y || (x == y && a < b);
      };
      if (k < n) std::nth_element(ids.begin(), ids.begin() + k, ids.end(), bigger);
    }
    ids.resize(static_cast<size_t>(k));
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  double ratio_;
  bool random_;
  uint64_t seed_;
  int64_t calls_ = 0;
  std::map<std::string, Tensor> err_;
};

}  // namespace

void GradCompressor::reduce(size_t bucket, Tensor& buffer,
                            const std::vector<CompressedParam>& params, const CommPtr& comm,
                            bool average) {
  if (active_) return compress_reduce(bucket, buffer, params, comm, average);
  // Note [Compression warm-up]: the plain reduction (as the DDP's own); the error feedback waits.
  autograd::NoGradGuard ng;
  comm->all_reduce(buffer, average ? ReduceOp::Avg : ReduceOp::Sum);
  sent_ += buffer.numel();
  dense_ += buffer.numel();
}

std::shared_ptr<GradCompressor> powersgd_compressor(int64_t rank, uint64_t seed) {
  return std::make_shared<PowerSGD>(rank, seed);
}

std::shared_ptr<GradCompressor> topk_compressor(double ratio, bool random, uint64_t seed) {
  return std::make_shared<TopK>(ratio, random, seed);
}

}  // namespace td::distributed
