// The training loop's reporting: the metrics row and log line of a step, the straggler report,
// the GEMM peak behind MFU (split from trainer.cpp; Note [C++ training loop] in trainer.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "py_format.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/error.h"
#include "tardelli/models/gpt.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/train/trainer.h"
#include "train_util.h"

namespace td::train {

namespace detail {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double perf_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string with_commas(double v) {
  if (!std::isfinite(v)) return fmt("%f", v);
  const long long n = std::llround(v);
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

namespace {

int64_t prod(const Shape& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

int64_t stage_layers(const models::GPT& m) {
  const models::GPTStage& s = m.stage();
  return s.num_layers < 0 ? m.config().n_layer - s.first_layer : s.num_layers;
}

}  // namespace

double chunk_flops(const models::GPT& m, int64_t batch, int64_t seq) {
  const models::GPTConfig& c = m.config();
  double n = 0;
  for (const auto& [name, t] : m.named_parameters()) {
    const Shape shape = m.full_shape(name);
    if (shape.size() < 2 || name == "wte.weight" || name == "wpe.weight") continue;
    if (name.find(".mlp.experts.") != std::string::npos) {
      n += static_cast<double>(prod(shape) * c.moe_top_k / c.num_experts);
    } else {
      n += static_cast<double>(prod(shape));
    }
  }
  if (c.arch == models::Arch::GPT2 && m.stage().post) {
    n += static_cast<double>(c.vocab_size * c.d_model);
  }
  const double tokens = static_cast<double>(batch * seq);
  return 6 * n * tokens + 6.0 * static_cast<double>(stage_layers(m)) * tokens *
                              static_cast<double>(seq) * static_cast<double>(c.d_model);
}

int64_t logical_params(const models::GPT& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.named_parameters()) n += prod(m.full_shape(name));
  return n;
}

}  // namespace detail

using detail::fmt;
using detail::perf_s;
using detail::with_commas;

json::Value StepRecord::to_json() const {
  json::Value r = json::Object{};
  r.set("step", step);
  r.set("loss", loss);
  r.set("lr", lr);
  r.set("grad_norm", grad_norm);
  r.set("tokens_per_s", tokens_per_s);
  r.set("time", time);
  r.set("mfu", mfu);
  r.set("mem_bytes", mem_bytes);
  r.set("peak_mem_bytes_max_rank", peak_mem_bytes_max_rank);
  json::Array compute, wait;
  for (double v : rank_compute_s) compute.emplace_back(v);
  for (double v : rank_wait_s) wait.emplace_back(v);
  r.set("rank_compute_s", std::move(compute));
  r.set("rank_wait_s", std::move(wait));
  if (dp_comm_bytes) r.set("dp_comm_bytes", *dp_comm_bytes);
  if (cross_node_bytes) r.set("cross_node_bytes", *cross_node_bytes);
  if (moe) {
    r.set("moe_aux_loss", moe->aux_loss);
    r.set("moe_z_loss", moe->z_loss);
    r.set("moe_max_load", moe->max_load);
    r.set("moe_mean_load", moe->mean_load);
    r.set("moe_dropped_tokens", moe->dropped_tokens);
  }
  if (loss_scale) r.set("loss_scale", *loss_scale);
  if (precision) r.set("precision", *precision);
  if (skipped) r.set("skipped", *skipped);
  if (nonfinite_skips) r.set("nonfinite_skips", *nonfinite_skips);
  if (val_loss) r.set("val_loss", *val_loss);
  if (save_blocked_s) r.set("save_blocked_s", *save_blocked_s);
  return r;
}

std::string format_log_line(const StepRecord& r, int64_t steps) {
  char head[64];
  std::snprintf(head, sizeof head, "step %6lld/%lld", static_cast<long long>(r.step),
                static_cast<long long>(steps));
  std::string line = std::string(head) + " | loss " + fmt("%.4f", r.loss) + " | lr " +
                     fmt("%.3e", r.lr) + " | grad norm " + fmt("%.3f", r.grad_norm) + " | " +
                     with_commas(r.tokens_per_s) + " tok/s | mfu " + fmt("%.1f", 100 * r.mfu) +
                     "% | mem " + fmt("%.0f", static_cast<double>(r.mem_bytes) / (1 << 20)) +
                     " MiB";
  if (r.moe) {
    line += " | moe aux " + fmt("%.3f", r.moe->aux_loss) + " z " + fmt("%.3f", r.moe->z_loss) +
            " max load " + fmt("%.2f", r.moe->max_load) + "x dropped " +
            std::to_string(r.moe->dropped_tokens);
  }
  if (r.loss_scale) {
    line += " | loss scale " + fmt("%g", *r.loss_scale) +
            (r.skipped.value_or(false) ? " (skipped)" : "");
  } else if (r.skipped.value_or(false)) {
    line += " | skipped";
  }
  if (r.nonfinite_skips.value_or(0) != 0) {
    line += " | non-finite skips " + std::to_string(*r.nonfinite_skips);
  }
  if (r.val_loss) line += " | val loss " + fmt("%.4f", *r.val_loss);
  return line;
}

double gemm_peak_flops(DType dtype, Device device, int64_t n, int reps) {
  const bool gpu = device.is_cuda();
  if (n <= 0) n = gpu ? 4096 : 1024;
  Tensor a = randn({n, n}).to(dtype).to(device);
  Tensor b = randn({n, n}).to(dtype).to(device);
  auto sync = [&] {
    if (gpu) cuda_synchronize(device.index);
  };
  matmul(a, b);
  sync();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < reps; ++i) {
    const double t0 = perf_s();
    matmul(a, b);
    sync();
    best = std::min(best, perf_s() - t0);
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

std::vector<std::pair<int, double>> stragglers(const std::vector<double>& compute,
                                               double threshold) {
  if (threshold <= 0 || compute.size() < 2) return {};
  // statistics.median: the middle value, or the mean of the two middle ones.
  std::vector<double> sorted = compute;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  if (median <= 0) return {};
  std::vector<std::pair<int, double>> out;
  for (size_t r = 0; r < n; ++r) {
    const double c = compute[r];
    if (c > threshold * median && c - median > kStragglerMinExcessS) {
      out.emplace_back(static_cast<int>(r), c / median);
    }
  }
  return out;
}

std::string straggler_line(int rank, double compute_s, double ratio) {
  return "train: straggler rank " + std::to_string(rank) + ": compute " + fmt("%.3f", compute_s) +
         " s is " + fmt("%.2f", ratio) + " x the median";
}

double slow_rank_seconds(int rank) {
  const char* env = std::getenv("TD_TEST_SLOW_RANK");
  const std::string spec = env != nullptr ? env : "";
  if (spec.empty()) return 0.0;
  const std::vector<std::string_view> parts = py::split(spec, ':');
  std::optional<int64_t> r;
  std::optional<double> seconds;
  if (parts.size() == 2) {
    r = py::parse_int(parts[0]);
    seconds = py::parse_float(parts[1]);
  }
  if (!r || !seconds) {
    throw ConfigError("TD_TEST_SLOW_RANK=" + py::repr(spec) +
                      ": expected RANK:SECONDS, e.g. 1:0.5");
  }
  return *r == rank ? *seconds : 0.0;
}

}  // namespace td::train
