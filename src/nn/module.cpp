#include "tardelli/nn/module.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "tardelli/autograd/grad_mode.h"
#include "tardelli/ops/copy.h"

namespace td::nn {

namespace {

void check_name(const std::string& name, const std::string& type, const char* what) {
  TD_CHECK(!name.empty() && name.find('.') == std::string::npos, type, ": invalid ", what,
           " name '", name, "' (must be non-empty and contain no '.')");
}

template <typename V>
bool has_name(const V& v, const std::string& name) {
  return std::any_of(v.begin(), v.end(), [&](const auto& p) { return p.first == name; });
}

}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_name(name, type_name_, "parameter");
  TD_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
           type_name_, ": attribute '", name, "' already registered");
  TD_CHECK(t.defined(), type_name_, ": parameter '", name, "' is undefined");
  TD_CHECK(t.is_leaf(), type_name_, ": parameter '", name, "' must be a leaf tensor (detach it)");
  if (requires_grad) t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name, type_name_, "buffer");
  TD_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
           type_name_, ": attribute '", name, "' already registered");
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_module(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name, type_name_, "submodule");
  TD_CHECK(m != nullptr, type_name_, ": submodule '", name, "' is null");
  TD_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
           type_name_, ": attribute '", name, "' already registered");
  children_.emplace_back(name, std::move(m));
}

void Module::replace_parameter(const std::string& name, Tensor t) {
  for (auto& [n, p] : params_) {
    if (n == name) {
      p = std::move(t);
      return;
    }
  }
  TD_ERROR(type_name_, ": no parameter named '", name, "'");
}

void Module::set_parameter(const std::string& path, Tensor t) {
  TD_CHECK(t.defined() && t.is_leaf(), type_name_, ".set_parameter: '", path,
           "' must be set to a defined leaf tensor");
  Module* m = this;
  std::string rest = path;
  for (size_t dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
    const std::string head = rest.substr(0, dot);
    Module* next = nullptr;
    for (auto& [n, c] : m->children_) {
      if (n == head) next = c.get();
    }
    TD_CHECK(next != nullptr, type_name_, ".set_parameter: no submodule '", head, "' on the path '",
             path, "'");
    m = next;
    rest = rest.substr(dot + 1);
  }
  m->replace_parameter(rest, std::move(t));
}

void Module::collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out,
                     std::vector<const TensorImpl*>* seen) const {
  for (const auto& [n, t] : params ? params_ : buffers_) {
    if (!t.defined()) continue;
    if (seen) {
      if (std::find(seen->begin(), seen->end(), t.impl()) != seen->end()) continue;
      seen->push_back(t.impl());
    }
    out.emplace_back(prefix + n, t);
  }
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, true, out, seen);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", true, recurse, out, &seen);
  return out;
}

TensorList Module::parameters(bool recurse) const {
  TensorList out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", false, recurse, out, &seen);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  auto self = weak_from_this().lock();
  TD_CHECK(self != nullptr, type_name_,
           ".named_modules: the module must be owned by a "
           "std::shared_ptr (create it with std::make_shared)");
  out.emplace_back("", self);
  for (const auto& [n, m] : children_) {
    for (auto& [sub, mm] : m->named_modules())
      out.emplace_back(sub.empty() ? n : n + "." + sub, mm);
  }
  return out;
}

StateDict Module::state_dict() const {
  NamedTensors all;
  collect("", true, true, all, nullptr);
  collect("", false, true, all, nullptr);
  StateDict sd;
  for (auto& [n, t] : all) sd[n] = t.detach();
  return sd;
}

void Module::load_state_dict(const StateDict& sd, bool strict) {
  NamedTensors all;
  collect("", true, true, all, nullptr);
  collect("", false, true, all, nullptr);
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> own;
  for (auto& [n, t] : all) {
    own.insert(n);
    auto it = sd.find(n);
    if (it == sd.end()) {
      missing.push_back(n);
    } else if (it->second.sizes() != t.sizes()) {
      mismatched.push_back(n + ": checkpoint " + shape_str(it->second.sizes()) + " vs model " +
                           shape_str(t.sizes()));
    }
  }
  for (auto& [n, t] : sd) {
    if (!own.count(n)) unexpected.push_back(n);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::ostringstream os;
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    return os.str();
  };
  TD_CHECK(mismatched.empty(), type_name_, ".load_state_dict: size mismatch for ",
           join(mismatched));
  TD_CHECK(!strict || (missing.empty() && unexpected.empty()), type_name_,
           ".load_state_dict: missing keys [", join(missing), "], unexpected keys [",
           join(unexpected), "]");
  autograd::NoGradGuard ng;
  for (auto& [n, t] : all) {
    auto it = sd.find(n);
    if (it != sd.end() && !it->second.is_same(t)) copy_into(t, it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad(bool set_to_none) {
  autograd::NoGradGuard ng;
  for (auto& t : parameters()) {
    if (!t.grad().defined()) continue;
    if (set_to_none) {
      t.set_grad(Tensor());
    } else {
      t.grad().zero_();
    }
  }
}

void Module::to(DType dtype) {
  TD_CHECK(is_floating(dtype), type_name_, ".to: target dtype must be floating, got ",
           dtype_name(dtype));
  convert_in_place([dtype](const Tensor& t) {
    return t.is_floating_point() && t.dtype() != dtype ? to_dtype(t, dtype) : Tensor();
  });
}

void Module::to(Device device) {
  convert_in_place([device](const Tensor& t) {
    return t.device() != device ? to_device(t, device) : Tensor();
  });
}

void Module::convert_in_place(const std::function<Tensor(const Tensor&)>& convert) {
  autograd::NoGradGuard ng;
  NamedTensors all;
  collect("", true, true, all, nullptr);
  collect("", false, true, all, nullptr);
  std::vector<TensorImpl*> done;
  for (auto& [n, t] : all) {
    if (std::find(done.begin(), done.end(), t.impl()) != done.end()) continue;
    done.push_back(t.impl());
    Tensor c = convert(t.detach());
    if (!c.defined()) continue;
    // Rebind the storage of the same TensorImpl so every holder (tied weights, optimizers,
    // Python) sees the converted tensor.
    TensorImpl* impl = t.impl();
    impl->storage = c.storage();
    impl->strides = c.strides();
    impl->offset = c.storage_offset();
    impl->dtype = c.dtype();
    if (t.grad().defined()) t.set_grad(Tensor());
  }
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

}  // namespace td::nn
