// adamw_step (single tensor and multi-tensor) on CUDA against the CPU backend, and the CUDA
// paths of the optimizers built on it (optim::AdamW, optim::SGD, clip_grad_norm_).
//
// Tolerances: both backends evaluate the same fp32 expressions in the same order, but the
// compilers fuse different multiply-adds into FMAs (g++ -march=x86-64-v3 and nvcc both
// contract), so an element can differ by about one fp32 ulp per step: parameters ~1 get
// 2e-6 absolute + 2e-6 relative over five steps, the moments 1e-5 relative (plus an absolute
// term for a moment that cancels to near zero: m + (1-b1)(g - m) with terms up to ~1). bf16
// parameters are rounded from those fp32 values, so one can land on the other side of a
// rounding boundary: up to two bf16 ulps (2^-7 relative each) over the steps, 2e-2 relative;
// fp16 likewise with its 10-bit mantissa, 2e-3. The moments do not depend on the parameter, so
// they keep the fp32 tolerance. Gradient norms are sums in double in a different order: 1e-10
// relative.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cuda_test_util.h"
#include "tardelli/core/cuda_runtime.h"
#include "tardelli/tardelli.h"

using namespace td;
using namespace td::test;

namespace {

// Odd sizes: one element, below and above a vector of four, one and two chunks (65536) plus a
// tail.
const std::vector<int64_t> kSizes = {1, 3, 17, 1000, 65537, 131075};

struct Lists {
  TensorList p, g, m, v;
};

// Parameters for kSizes on `device`, moments zero.
Lists make_lists(Device device, DType pdt) {
  Lists l;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    Tensor p = randn_seeded({kSizes[k]}, 100 + k, pdt);
    l.p.push_back(device.is_cuda() ? on_cuda(p) : p);
    l.m.push_back(zeros({kSizes[k]}, {DType::Float32, device}));
    l.v.push_back(zeros({kSizes[k]}, {DType::Float32, device}));
  }
  return l;
}

// Fresh gradients for a step (same values on both devices).
void set_grads(Lists& l, int step, DType gdt) {
  l.g.clear();
  for (size_t k = 0; k < kSizes.size(); ++k) {
    Tensor g = randn_seeded({kSizes[k]}, 1000 * step + k, gdt);
    l.g.push_back(l.p[k].is_cuda() ? on_cuda(g) : g);
  }
}

void expect_lists_close(const Lists& cuda, const Lists& cpu, double p_atol, double p_rtol,
                        const std::string& what) {
  for (size_t k = 0; k < cpu.p.size(); ++k) {
    const std::string w = what + " tensor " + std::to_string(k);
    expect_close(doubles(on_cpu(cuda.p[k])), doubles(cpu.p[k]), p_atol, p_rtol, w + " param");
    expect_close(doubles(on_cpu(cuda.m[k])), doubles(cpu.m[k]), 1e-7, 1e-5, w + " exp_avg");
    expect_close(doubles(on_cpu(cuda.v[k])), doubles(cpu.v[k]), 1e-9, 1e-5, w + " exp_avg_sq");
  }
}

}  // namespace

TEST(AdamWCuda, MultiTensorMatchesCpuOverSteps) {
  TD_REQUIRE_CUDA();
  struct Case {
    DType p, g;
    double atol, rtol;
  };
  const Case cases[] = {{DType::Float32, DType::Float32, 2e-6, 2e-6},
                        {DType::BFloat16, DType::BFloat16, 1e-2, 2e-2},
                        {DType::BFloat16, DType::Float32, 1e-2, 2e-2},
                        {DType::Float16, DType::Float32, 2e-3, 2e-3}};
  for (const Case& cs : cases) {
    for (double wd : {0.0, 0.1}) {
      Lists cpu = make_lists(kCPU, cs.p), cuda = make_lists(cuda_device(), cs.p);
      AdamWConfig cfg;
      cfg.lr = 1e-2;
      cfg.weight_decay = wd;
      for (int step = 1; step <= 5; ++step) {
        cfg.step = step;
        set_grads(cpu, step, cs.g);
        set_grads(cuda, step, cs.g);
        adamw_step(cpu.p, cpu.g, cpu.m, cpu.v, cfg);
        adamw_step(cuda.p, cuda.g, cuda.m, cuda.v, cfg);
      }
      expect_lists_close(
          cuda, cpu, cs.atol, cs.rtol,
          std::string(dtype_name(cs.p)) + "/" + dtype_name(cs.g) + " wd=" + std::to_string(wd));
    }
  }
}

TEST(AdamWCuda, SingleTensorEqualsListAndCpu) {
  TD_REQUIRE_CUDA();
  AdamWConfig cfg;
  cfg.lr = 3e-3;
  cfg.step = 7;  // bias correction of a later step
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-6;
  const int64_t n = 4099;
  Tensor p0 = randn_seeded({n}, 1), g = randn_seeded({n}, 2);
  Tensor m0 = randn_seeded({n}, 3, 0.1), r = randn_seeded({n}, 4, 0.1);
  Tensor v0 = add(mul(r, r), 1e-4);  // second moments are positive
  // CPU reference.
  Tensor pc = p0.clone(), mc = m0.clone(), vc = v0.clone();
  adamw_step(pc, g, mc, vc, cfg);
  // CUDA, single-tensor overload and list overload: the same kernel, so bitwise equal.
  Tensor p1 = on_cuda(p0), m1 = on_cuda(m0), v1 = on_cuda(v0), gg = on_cuda(g);
  adamw_step(p1, gg, m1, v1, cfg);
  TensorList pl{on_cuda(p0)}, gl{gg}, ml{on_cuda(m0)}, vl{on_cuda(v0)};
  adamw_step(pl, gl, ml, vl, cfg);
  EXPECT_TRUE(test::same_bytes(on_cpu(p1), on_cpu(pl[0])));
  EXPECT_TRUE(test::same_bytes(on_cpu(m1), on_cpu(ml[0])));
  expect_close(doubles(on_cpu(p1)), doubles(pc), 2e-6, 2e-6, "param");
  expect_close(doubles(on_cpu(m1)), doubles(mc), 1e-7, 1e-5, "exp_avg");
  expect_close(doubles(on_cpu(v1)), doubles(vc), 1e-9, 1e-5, "exp_avg_sq");
}

TEST(AdamWCuda, MisalignedTensorsAndMixedDevices) {
  TD_REQUIRE_CUDA();
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  // Views starting one element into their storage (contiguous, but not 16-byte aligned): the
  // kernel's scalar path.
  const int64_t n = 1031;
  Tensor pb = randn_seeded({n + 1}, 1), gb = randn_seeded({n + 1}, 2);
  Tensor pc = pb.clone().narrow(0, 1, n), gc = gb.narrow(0, 1, n);
  Tensor mc = zeros({n}), vc = zeros({n});
  adamw_step(pc, gc, mc, vc, cfg);
  Tensor pd = on_cuda(pb).narrow(0, 1, n), gd = on_cuda(gb).narrow(0, 1, n);
  Tensor md = zeros({n}, {DType::Float32, cuda_device()}),
         vd = zeros({n}, {DType::Float32, cuda_device()});
  adamw_step(pd, gd, md, vd, cfg);
  expect_close(doubles(on_cpu(pd)), doubles(pc), 2e-6, 2e-6, "misaligned param");
  // One list holding CPU and CUDA tensors: each goes to its own backend.
  Tensor a = randn_seeded({33}, 5), b = randn_seeded({65}, 6), ga = randn_seeded({33}, 7),
         gb2 = randn_seeded({65}, 8);
  TensorList ref_p{a.clone(), b.clone()}, ref_g{ga, gb2}, ref_m{zeros({33}), zeros({65})},
      ref_v{zeros({33}), zeros({65})};
  adamw_step(ref_p, ref_g, ref_m, ref_v, cfg);
  TensorList mp{a.clone(), on_cuda(b)}, mg{ga, on_cuda(gb2)},
      mm{zeros({33}), zeros({65}, {DType::Float32, cuda_device()})},
      mv{zeros({33}), zeros({65}, {DType::Float32, cuda_device()})};
  adamw_step(mp, mg, mm, mv, cfg);
  EXPECT_TRUE(test::same_bytes(mp[0], ref_p[0]));
  expect_close(doubles(on_cpu(mp[1])), doubles(ref_p[1]), 2e-6, 2e-6, "mixed list");
}

TEST(AdamWCuda, EmptyTensorsAndEmptyList) {
  TD_REQUIRE_CUDA();
  AdamWConfig cfg;
  TensorList p{on_cuda(Tensor::empty({0}))}, g{on_cuda(Tensor::empty({0}))},
      m{on_cuda(Tensor::empty({0}))}, v{on_cuda(Tensor::empty({0}))};
  EXPECT_NO_THROW(adamw_step(p, g, m, v, cfg));
  TensorList none;
  TensorList none_g, none_m, none_v;
  EXPECT_NO_THROW(adamw_step(none, none_g, none_m, none_v, cfg));
}

TEST(AdamWCuda, BadInputsRaise) {
  TD_REQUIRE_CUDA();
  AdamWConfig cfg;
  const Device dev = cuda_device();
  Tensor p = on_cuda(randn_seeded({8}, 1));
  Tensor g = on_cuda(randn_seeded({8}, 2));
  Tensor m = zeros({8}, {DType::Float32, dev}), v = zeros({8}, {DType::Float32, dev});
  Tensor g_cpu = randn_seeded({8}, 2);
  EXPECT_THROW(adamw_step(p, g_cpu, m, v, cfg), Error);  // grad on another device
  Tensor m_bf = zeros({8}, {DType::BFloat16, dev});
  EXPECT_THROW(adamw_step(p, g, m_bf, v, cfg), Error);  // moments must be fp32
  Tensor g_short = on_cuda(randn_seeded({7}, 3));
  EXPECT_THROW(adamw_step(p, g_short, m, v, cfg), Error);  // numel mismatch
  Tensor p2 = on_cuda(randn_seeded({4, 2}, 4)).transpose(0, 1);
  Tensor g2 = zeros({2, 4}, {DType::Float32, dev});
  Tensor m2 = zeros({2, 4}, {DType::Float32, dev}), v2 = zeros({2, 4}, {DType::Float32, dev});
  EXPECT_THROW(adamw_step(p2, g2, m2, v2, cfg), Error);  // not contiguous
  Tensor p_bf = on_cuda(randn_seeded({8}, 5, DType::BFloat16));
  Tensor g_h = on_cuda(randn_seeded({8}, 6, DType::Float16));
  EXPECT_THROW(adamw_step(p_bf, g_h, m, v, cfg), Error);  // grad dtype neither param's nor fp32
  cfg.step = 0;
  EXPECT_THROW(adamw_step(p, g, m, v, cfg), Error);
}

// ---- optimizers on CUDA parameters ----

namespace {

// Leaves with the same values on both devices.
TensorList make_params(Device device) {
  TensorList ps;
  const Shape shapes[] = {{3, 5}, {17}, {70000}, {1}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    Tensor p = randn_seeded(s, seed++);
    if (device.is_cuda()) p = on_cuda(p);
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  return ps;
}

void set_param_grads(const TensorList& ps, int step) {
  for (size_t k = 0; k < ps.size(); ++k) {
    Tensor g = randn_seeded(ps[k].sizes(), 500 * step + k);
    ps[k].set_grad(ps[k].is_cuda() ? on_cuda(g) : g);
  }
}

void expect_params_close(const TensorList& cuda, const TensorList& cpu, double atol, double rtol,
                         const std::string& what) {
  for (size_t k = 0; k < cpu.size(); ++k) {
    ASSERT_TRUE(cuda[k].is_cuda());
    expect_close(doubles(on_cpu(cuda[k].detach())), doubles(cpu[k].detach()), atol, rtol,
                 what + " param " + std::to_string(k));
  }
}

}  // namespace

TEST(OptimCuda, AdamWOptimizerMatchesCpu) {
  TD_REQUIRE_CUDA();
  TensorList pc = make_params(kCPU), pd = make_params(cuda_device());
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  optim::AdamW oc(pc, o), od(pd, o);
  for (int step = 1; step <= 4; ++step) {
    set_param_grads(pc, step);
    set_param_grads(pd, step);
    oc.step();
    od.step();
  }
  expect_params_close(pd, pc, 2e-6, 2e-6, "AdamW");
  // The state lives on the parameters' device, and a CPU state dict loads onto it.
  optim::AdamW od2(pd, o);
  od2.load_state_dict(oc.state_dict());
  for (const auto& [index, st] : od2.state_dict().state) {
    for (const auto& [name, t] : st.tensors) EXPECT_TRUE(t.is_cuda()) << name << " " << index;
  }
}

TEST(OptimCuda, SGDMatchesCpu) {
  TD_REQUIRE_CUDA();
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case& cs :
       {Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.1, 0.01, false}, Case{0.9, 0.0, 0.01, true}}) {
    TensorList pc = make_params(kCPU), pd = make_params(cuda_device());
    optim::SGDOptions o;
    o.lr = 0.05;
    o.momentum = cs.momentum;
    o.dampening = cs.dampening;
    o.weight_decay = cs.wd;
    o.nesterov = cs.nesterov;
    optim::SGD oc(pc, o), od(pd, o);
    for (int step = 1; step <= 3; ++step) {
      set_param_grads(pc, step);
      set_param_grads(pd, step);
      oc.step();
      od.step();
    }
    expect_params_close(pd, pc, 1e-6, 1e-6, "SGD momentum=" + std::to_string(cs.momentum));
  }
}

TEST(OptimCuda, ClipGradNormMatchesCpu) {
  TD_REQUIRE_CUDA();
  for (double norm_type : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    TensorList pc = make_params(kCPU), pd = make_params(cuda_device());
    set_param_grads(pc, 1);
    set_param_grads(pd, 1);
    const double nc = optim::clip_grad_norm_(pc, 0.5, norm_type);
    const double nd = optim::clip_grad_norm_(pd, 0.5, norm_type);
    EXPECT_NEAR(nd, nc, 1e-10 * nc) << norm_type;
    for (size_t k = 0; k < pc.size(); ++k) {
      expect_close(doubles(on_cpu(pd[k].grad())), doubles(pc[k].grad()), 1e-7, 1e-6,
                   "clipped grad " + std::to_string(k));
    }
    // Deterministic: the same norm again.
    EXPECT_EQ(optim::grad_norm(pd, norm_type), optim::grad_norm(pd, norm_type));
  }
  // A NaN gradient gives a NaN infinity-norm, as on the CPU.
  TensorList pd = make_params(cuda_device());
  set_param_grads(pd, 2);
  pd[1].set_grad(on_cuda(full({17}, std::nan(""))));
  EXPECT_TRUE(std::isnan(optim::grad_norm(pd, std::numeric_limits<double>::infinity())));
}
