#include "tardelli/nn/container.h"

#include <string>

namespace td::nn {

namespace {

int64_t wrap_index(int64_t i, int64_t n, const char* who) {
  TD_CHECK(i >= -n && i < n, who, ": index ", i, " out of range for ", n, " modules");
  return i < 0 ? i + n : i;
}

}  // namespace

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) : ModuleList() {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  TD_CHECK(m != nullptr, "ModuleList.push_back: module is null");
  add_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
}

std::shared_ptr<Module> ModuleList::operator[](int64_t i) const {
  return modules_[wrap_index(i, size(), "ModuleList")];
}

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> modules) : Sequential() {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<UnaryModule> m) {
  TD_CHECK(m != nullptr, "Sequential.push_back: module is null");
  add_module(std::to_string(modules_.size()), m);
  modules_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

std::shared_ptr<UnaryModule> Sequential::operator[](int64_t i) const {
  return modules_[wrap_index(i, size(), "Sequential")];
}

}  // namespace td::nn
