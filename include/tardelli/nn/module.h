#pragma once
// td::nn::Module: the C++ module system (torch.nn.Module's contract). A module owns named
// parameters, buffers and submodules; names compose with dots ("h.0.attn.c_attn.weight").
// Parameters are ordinary tensors that require grad; a module never copies them, so optimizers
// and the Python wrapper see the same storage.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tardelli/core/tensor.h"

namespace td::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using StateDict = std::map<std::string, Tensor>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // Registration (names must be unique within this module and contain no '.').
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_module(name, m);
    return m;
  }

  // Traversal in registration order; shared tensors (tied weights) appear once, under the
  // first name that reaches them, as in torch.
  NamedTensors named_parameters(bool recurse = true) const;
  TensorList parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  // Parameters and buffers by full name (tied tensors appear under every name, like torch).
  StateDict state_dict() const;
  // Copies values into the existing tensors (dtype converted, shapes must match). strict: the
  // key sets must be equal; the error names missing and unexpected keys and shape mismatches.
  void load_state_dict(const StateDict& sd, bool strict = true);

  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad(bool set_to_none = true);
  // Converts floating parameters and buffers in place (the Tensor handles stay the same).
  void to(DType dtype);
  // Moves parameters and buffers to `device` in place (the Tensor handles stay the same).
  void to(Device device);
  int64_t num_parameters() const;

  // Points the registered parameter at a dotted path ("h.0.attn.c_attn.weight") at another
  // leaf tensor, which may have another shape (a parallel layout replacing a full weight by
  // its shard). td::Error naming the path when no such parameter exists.
  void set_parameter(const std::string& path, Tensor t);

 protected:
  void add_module(const std::string& name, std::shared_ptr<Module> m);
  // Points an existing registered parameter at another tensor (weight tying).
  void replace_parameter(const std::string& name, Tensor t);

 private:
  // Replaces each distinct parameter/buffer by convert(it) unless that is undefined.
  void convert_in_place(const std::function<Tensor(const Tensor&)>& convert);
  void collect(const std::string& prefix, bool params, bool recurse, NamedTensors& out,
               std::vector<const TensorImpl*>* seen) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace td::nn
