#include "tardelli/models/precision_policy.h"

#include <algorithm>
#include <utility>

#include "tardelli/core/error.h"

namespace td::models {

const char* precision_name(LinearPrecision p) {
  switch (p) {
    case LinearPrecision::FP8:
      return "fp8";
    case LinearPrecision::BF16:
      return "bf16";
    case LinearPrecision::FP32:
      return "fp32";
    default:
      return "default";
  }
}

LinearPrecision parse_precision(const std::string& name, const std::string& what) {
  if (name == "fp8") return LinearPrecision::FP8;
  if (name == "bf16") return LinearPrecision::BF16;
  if (name == "fp32") return LinearPrecision::FP32;
  TD_CHECK(false, what, ": unknown precision '", name, "' (expected fp8, bf16 or fp32)");
  return LinearPrecision::Default;
}

namespace {

constexpr const char* kLinears[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
constexpr const char* kAliases[4] = {"qkv", "attn_out", "mlp_in", "mlp_out"};

// "h.{i}.{linear}" or "blocks.{i}.{alias}" -> (i, linear index); false when it is neither.
bool split_name(const std::string& name, int64_t* layer, int* which) {
  for (const auto& [prefix, suffixes] :
       {std::pair<std::string, const char* const*>{"h.", kLinears}, {"blocks.", kAliases}}) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) return false;
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        digits.size() > 9)
      return false;
    for (int k = 0; k < 4; ++k) {
      if (name.compare(dot + 1, std::string::npos, suffixes[k]) == 0) {
        *layer = std::stoll(digits);
        *which = k;
        return true;
      }
    }
    return false;
  }
  return false;
}

// Note [Adaptive precision]: stable = within half the thresholds of the lower precision.
bool over_fp8(const LinearStats& s, const PrecisionPolicyOptions& o, double f) {
  const double n = static_cast<double>(std::max<int64_t>(s.fp8.values, 1));
  return s.fp8.overflow / n > f * o.fp8_overflow || s.fp8.underflow / n > f * o.fp8_underflow ||
         s.fp8_error > f * o.fp8_error;
}

bool over_bf16(const LinearStats& s, const PrecisionPolicyOptions& o, double f) {
  return s.nonfinite > 0 || s.bf16_error > f * o.bf16_error;
}

}  // namespace

std::vector<std::string> block_linear_names(int64_t first_layer, int64_t num_layers) {
  std::vector<std::string> out;
  for (int64_t i = first_layer; i < first_layer + num_layers; ++i) {
    for (const char* l : kLinears) out.push_back("h." + std::to_string(i) + "." + l);
  }
  return out;
}

std::map<std::string, LinearPrecision> parse_precision_map(
    const std::map<std::string, std::string>& entries, int64_t n_layer) {
  std::map<std::string, LinearPrecision> out;
  for (const auto& [name, value] : entries) {
    int64_t layer = -1;
    int which = -1;
    TD_CHECK(split_name(name, &layer, &which), "precision map entry '", name,
             "': not a block linear (expected h.{i}.attn.c_attn, h.{i}.attn.c_proj, "
             "h.{i}.mlp.c_fc, h.{i}.mlp.c_proj or blocks.{i}.{qkv,attn_out,mlp_in,mlp_out})");
    TD_CHECK(layer < n_layer, "precision map entry '", name, "': the model has layers 0..",
             n_layer - 1);
    const std::string canonical = "h." + std::to_string(layer) + "." + kLinears[which];
    const LinearPrecision p = parse_precision(value, "precision map entry '" + name + "'");
    auto [it, fresh] = out.emplace(canonical, p);
    TD_CHECK(fresh || it->second == p, "precision map entry '", name, "': ", canonical,
             " is given twice with different precisions");
  }
  return out;
}

void LinearStats::merge(const LinearStats& o) {
  fp8.add(o.fp8);
  fp8_error = std::max(fp8_error, o.fp8_error);
  bf16_error = std::max(bf16_error, o.bf16_error);
  nonfinite += o.nonfinite;
}

PrecisionPolicy::PrecisionPolicy(std::vector<std::string> names,
                                 std::vector<LinearPrecision> floors,
                                 PrecisionPolicyOptions options)
    : names_(std::move(names)), floor_(std::move(floors)), options_(options) {
  TD_CHECK(names_.size() == floor_.size(), "PrecisionPolicy: ", names_.size(), " names but ",
           floor_.size(), " floors");
  for (size_t i = 0; i < floor_.size(); ++i) {
    TD_CHECK(floor_[i] != LinearPrecision::Default, "PrecisionPolicy: linear ", names_[i],
             " needs a floor of fp8, bf16 or fp32");
  }
  TD_CHECK(options_.fp8_overflow >= 0 && options_.fp8_underflow >= 0 && options_.fp8_error >= 0 &&
               options_.bf16_error >= 0,
           "PrecisionPolicy: thresholds must be >= 0");
  TD_CHECK(options_.stable_steps >= 1, "PrecisionPolicy: stable_steps must be >= 1, got ",
           options_.stable_steps);
  precision_ = floor_;
  stable_.assign(names_.size(), 0);
}

std::vector<PrecisionChange> PrecisionPolicy::update(const std::vector<LinearStats>& stats) {
  TD_CHECK(stats.size() == names_.size(), "PrecisionPolicy.update: ", stats.size(),
           " statistics for ", names_.size(), " linears");
  std::vector<PrecisionChange> changes;
  for (size_t i = 0; i < names_.size(); ++i) {
    const LinearStats& s = stats[i];
    const LinearPrecision p = precision_[i];
    LinearPrecision next = p;
    const bool fp8_measured = s.fp8.values > 0 || s.fp8_error > 0;
    const bool bf16_measured = s.bf16_error > 0 || s.nonfinite > 0;
    if (p == LinearPrecision::FP8) {
      if (fp8_measured && over_fp8(s, options_, 1.0)) next = LinearPrecision::BF16;
    } else if (p == LinearPrecision::BF16) {
      if (bf16_measured && over_bf16(s, options_, 1.0)) {
        next = LinearPrecision::FP32;
      } else if (floor_[i] == LinearPrecision::FP8) {
        stable_[i] = fp8_measured && !over_fp8(s, options_, 0.5) ? stable_[i] + 1 : 0;
        if (stable_[i] >= options_.stable_steps) next = LinearPrecision::FP8;
      }
    } else if (p == LinearPrecision::FP32 && floor_[i] != LinearPrecision::FP32) {
      stable_[i] = bf16_measured && !over_bf16(s, options_, 0.5) ? stable_[i] + 1 : 0;
      if (stable_[i] >= options_.stable_steps) next = LinearPrecision::BF16;
    }
    if (next != p) {
      changes.push_back({names_[i], p, next});
      precision_[i] = next;
      stable_[i] = 0;
    }
  }
  return changes;
}

void PrecisionPolicy::set_state(const std::string& name, LinearPrecision precision,
                                int64_t stable) {
  auto it = std::find(names_.begin(), names_.end(), name);
  TD_CHECK(it != names_.end(), "PrecisionPolicy.set_state: no linear named '", name, "'");
  const size_t i = static_cast<size_t>(it - names_.begin());
  TD_CHECK(precision != LinearPrecision::Default && precision >= floor_[i],
           "PrecisionPolicy.set_state: ", name, " cannot run in ", precision_name(precision),
           " below its floor ", precision_name(floor_[i]));
  TD_CHECK(stable >= 0, "PrecisionPolicy.set_state: ", name, ": stable count ", stable, " < 0");
  precision_[i] = precision;
  stable_[i] = stable;
}

}  // namespace td::models
