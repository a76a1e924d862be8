#pragma once
// td::nn::ModuleList and td::nn::Sequential (torch.nn.ModuleList / torch.nn.Sequential). Both
// register their entries as children named "0", "1", ... so parameter names read
// "h.0.attn.c_attn.weight" as in torch.
#include <memory>
#include <vector>

#include "tardelli/nn/linear.h"

namespace td::nn {

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);

  void push_back(std::shared_ptr<Module> m);
  // Python-style index: negative counts from the end; out of range is a td::Error.
  std::shared_ptr<Module> operator[](int64_t i) const;
  // The entry as M (td::Error if it is not an M).
  template <typename M>
  std::shared_ptr<M> at(int64_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    TD_CHECK(m != nullptr, "ModuleList.at: entry ", i, " has type ", (*this)[i]->type_name());
    return m;
  }
  int64_t size() const { return static_cast<int64_t>(modules_.size()); }
  bool empty() const { return modules_.empty(); }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Applies its modules in order: forward(x) = m_n(...m_1(x)).
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> modules);

  void push_back(std::shared_ptr<UnaryModule> m);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<UnaryModule> operator[](int64_t i) const;
  int64_t size() const { return static_cast<int64_t>(modules_.size()); }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

}  // namespace td::nn
