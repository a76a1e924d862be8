// td::distributed::DistributedOptimizer (ZeRO-1 AdamW), run under mpirun at 2 and 4 ranks.
//
// The reference is single-process training on the whole global batch with td::optim::AdamW and
// td::optim::clip_grad_norm_, computed on every rank. Tolerances: Note [DP tolerance] in
// data_parallel_test_util.h.
#include <gtest/gtest.h>

#include <tuple>

#include "data_parallel_test_util.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/factory.h"

namespace td::distributed {
namespace {

using namespace dp_test;

int64_t total_numel(const models::GPT& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Property: 5 ZeRO-1 steps (clip_grad_norm that bites, then AdamW with weight decay on matrices
// only) give the same losses, grad norms and parameters as 5 single-process steps on the full
// batch, with tiny buckets (shards straddle parameters of both groups) and with one bucket; every
// rank ends each step with bitwise identical parameters (they come from one all-gather).
TEST(ZeRO1, FiveStepsMatchSingleProcess) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  for (int64_t bucket_bytes : {int64_t{4096}, int64_t{40'000'000}}) {
    auto ref = tiny_gpt(models::Arch::Llama);
    auto model = tiny_gpt(models::Arch::Llama);
    optim::AdamWOptions ao;
    ao.lr = 3e-3;
    optim::AdamW ref_opt(dp_test::adamw_groups(*ref, 0.1), ao);
    DistributedDataParallel ddp(model->named_parameters(), comm,
                                {bucket_bytes, true, /*reduce_scatter=*/true, true});
    DistributedOptimizer opt(ddp, dp_test::adamw_groups(*model, 0.1), ao);
    // Some shard piece must straddle: pieces of both groups in one bucket.
    for (int step = 0; step < 5; ++step) {
      Batch global = global_batch(kRowsPerRank * n, 20 + step);
      const StepResult want = reference_step(*ref, ref_opt, global, 0.5);

      opt.zero_grad();
      Tensor loss = local_forward_backward(*model, ddp, global, r);
      const double norm = opt.clip_grad_norm(0.5);
      opt.step();
      expect_step_matches(
          *comm, loss, norm, want, 0.5,
          "step " + std::to_string(step) + " bucket_bytes " + std::to_string(bucket_bytes));
    }
    EXPECT_EQ(opt.step_count(), 5);
    expect_params_match_and_replicated(*comm, *model, *ref);
  }
}

// Property: the shards partition the parameters: summed over ranks the optimizer state is
// exactly 8 bytes (exp_avg + exp_avg_sq, fp32; the masters are the fp32 parameters' own slices,
// Note [Masters are the parameters]) per parameter element, and each rank holds at most its
// buckets' shard sizes, i.e. total / dp up to the padding of each bucket.
TEST(ZeRO1, StateBytesAreOneOverDp) {
  CommPtr comm = world();
  const int n = comm->size();
  auto model = tiny_gpt();
  DistributedDataParallel ddp(model->named_parameters(), comm, {8192, true, true, true});
  DistributedOptimizer opt(ddp, dp_test::adamw_groups(*model, 0.1));
  const int64_t total = total_numel(*model);
  const int64_t mine = opt.optimizer_state_bytes();
  Tensor all = full({1}, static_cast<double>(mine), {DType::Int64});
  comm->all_reduce(all, ReduceOp::Sum);
  ASSERT_TRUE(opt.masters_are_params());
  EXPECT_EQ(all.item<int64_t>(), 8 * total);
  int64_t shard = 0, padding = 0;
  for (const auto& bk : ddp.buckets()) {
    shard += bk.shard_numel;
    padding += bk.padded_numel - bk.numel;
  }
  EXPECT_LE(mine, 8 * shard);
  EXPECT_GE(mine, 8 * (shard - padding));
  EXPECT_LE(std::abs(static_cast<double>(mine) - 8.0 * total / n), 8.0 * padding + 8.0);
  // Each master is a view of its parameter: no fp32 copy.
  for (const auto& pc : opt.pieces()) {
    EXPECT_TRUE(pc.master.shares_storage(ddp.params()[pc.param].param)) << pc.param;
  }
}

// Property: named_state() round-trips: loading a saved shard state into a fresh optimizer over
// a model with the same parameters makes the next step identical, bit for bit, to the original
// optimizer's; keys name the parameter element ranges; mismatched keys are a td::Error.
TEST(ZeRO1, NamedStateRoundTrip) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  auto run_step = [&](models::GPT& m, DistributedDataParallel& ddp, DistributedOptimizer& opt,
                      int64_t seed) {
    opt.zero_grad();
    Batch b = global_batch(kRowsPerRank * n, seed).rows(r * kRowsPerRank, kRowsPerRank);
    m.forward(b.idx, b.targets).backward();
    ddp.finish_grad_sync();
    opt.step();
  };
  auto a = tiny_gpt();
  DistributedDataParallel ddp_a(a->named_parameters(), comm, {8192, true, true, true});
  DistributedOptimizer opt_a(ddp_a, dp_test::adamw_groups(*a, 0.1));
  run_step(*a, ddp_a, opt_a, 30);
  run_step(*a, ddp_a, opt_a, 31);
  std::map<std::string, Tensor> saved;
  for (const auto& [k, v] : opt_a.named_state()) saved[k] = v.clone();
  EXPECT_EQ(saved.at("step").item<int64_t>(), 2);
  for (const auto& [k, v] : saved) {
    if (k == "step") continue;
    EXPECT_TRUE(k.find(".master[") != std::string::npos ||
                k.find(".exp_avg[") != std::string::npos ||
                k.find(".exp_avg_sq[") != std::string::npos)
        << k;
  }

  auto b = tiny_gpt();
  b->load_state_dict(a->state_dict());
  DistributedDataParallel ddp_b(b->named_parameters(), comm, {8192, true, true, true});
  DistributedOptimizer opt_b(ddp_b, dp_test::adamw_groups(*b, 0.1));
  opt_b.load_named_state(saved);
  EXPECT_EQ(opt_b.step_count(), 2);
  run_step(*a, ddp_a, opt_a, 32);
  run_step(*b, ddp_b, opt_b, 32);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(to_vector<float>(pa[i].second), to_vector<float>(pb[i].second)) << pa[i].first;
  }

  std::map<std::string, Tensor> bad = saved;
  bad.erase(bad.begin());
  bad["nonsense"] = zeros({1});
  try {
    opt_b.load_named_state(bad);
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Unexpected: nonsense"), std::string::npos) << e.what();
  }
}

// Property: misuse is a td::Error with a clear message: a DDP without reduce_scatter, a
// parameter in no group or in two, a foreign tensor, and step() before finish_grad_sync().
TEST(ZeRO1, Misuse) {
  CommPtr comm = world();
  auto model = tiny_gpt();
  auto msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  DistributedDataParallel plain(model->named_parameters(), comm, {8192, true, false, true});
  EXPECT_NE(msg([&] {
              DistributedOptimizer o(plain, dp_test::adamw_groups(*model, 0.1));
            }).find("reduce_scatter=true"),
            std::string::npos);

  auto m2 = tiny_gpt();
  DistributedDataParallel ddp(m2->named_parameters(), comm, {8192, true, true, true});
  auto groups = dp_test::adamw_groups(*m2, 0.1);
  auto missing = groups;
  missing[1].params.pop_back();
  EXPECT_NE(msg([&] { DistributedOptimizer o(ddp, missing); }).find("is in no group"),
            std::string::npos);
  auto twice = groups;
  twice[1].params.push_back(twice[0].params[0]);
  EXPECT_NE(msg([&] { DistributedOptimizer o(ddp, twice); }).find("more than one group"),
            std::string::npos);
  auto foreign = groups;
  foreign[0].params.push_back(zeros({2}));
  EXPECT_NE(msg([&] {
              DistributedOptimizer o(ddp, foreign);
            }).find("not a parameter of the DistributedDataParallel"),
            std::string::npos);
  DistributedOptimizer opt(ddp, groups);
  EXPECT_NE(msg([&] { opt.step(); }).find("call ddp.finish_grad_sync()"), std::string::npos);
}

// One step of rank r with two micro-batches (its two rows, each loss scaled by 1/2), then the
// gradient sync; returns the local mean loss. The first micro-batch only accumulates (no_sync)
// where the mode honours it.
Tensor two_microbatch_step(models::GPT& model, DistributedDataParallel& ddp, const Batch& global,
                           int r) {
  double total = 0;
  for (int m = 0; m < 2; ++m) {
    Batch mb = global.rows(r * kRowsPerRank + m, 1);
    Tensor loss = model.forward(mb.idx, mb.targets);
    ddp.set_last_microbatch(m == 1);  // ZeRO-1 accumulates first; ZeRO-2 ignores it
    mul(loss, 0.5).backward();
    total += 0.5 * loss.item_double();
  }
  ddp.finish_grad_sync();
  return full({1}, total);
}

DDPOptions zero2_options(int64_t bucket_bytes) {
  DDPOptions o;
  o.bucket_bytes = bucket_bytes;
  o.reduce_scatter = true;
  o.shard_grads = true;
  return o;
}

// Property (ZeRO-2): with gradient accumulation over 2 micro-batches, every micro-batch
// reduce-scatters every bucket (2 x buckets collectives per step), the full buckets are freed
// after the step's reductions (only the fp32 shards, total / dp, stay allocated), and 3 steps
// (clipping active) match 3 single-process steps on the whole batch: losses and norms at 1e-5,
// parameters at kParamRtol (Note [DP tolerance]), bitwise identical on every rank; with tiny
// buckets and with one bucket.
TEST(ZeRO2, AccumulatedStepsMatchSingleProcess) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  for (int64_t bucket_bytes : {int64_t{4096}, int64_t{40'000'000}}) {
    auto ref = tiny_gpt(models::Arch::Llama);
    auto model = tiny_gpt(models::Arch::Llama);
    optim::AdamWOptions ao;
    ao.lr = 3e-3;
    optim::AdamW ref_opt(dp_test::adamw_groups(*ref, 0.1), ao);
    DistributedDataParallel ddp(model->named_parameters(), comm, zero2_options(bucket_bytes));
    DistributedOptimizer opt(ddp, dp_test::adamw_groups(*model, 0.1), ao);
    const auto nb = static_cast<int64_t>(ddp.buckets().size());
    int64_t shard_bytes = 0;
    for (const auto& bk : ddp.buckets()) shard_bytes += 4 * bk.shard_numel;
    EXPECT_EQ(ddp.grad_buffer_bytes(), shard_bytes);
    for (int step = 0; step < 3; ++step) {
      Batch global = global_batch(kRowsPerRank * n, 40 + step);
      const StepResult want = reference_step(*ref, ref_opt, global, 0.5);
      opt.zero_grad();
      const int64_t before = ddp.num_collectives();
      Tensor loss = two_microbatch_step(*model, ddp, global, r);
      EXPECT_EQ(ddp.num_collectives() - before, 2 * nb);
      EXPECT_EQ(ddp.grad_buffer_bytes(), shard_bytes);
      const double norm = opt.clip_grad_norm(0.5);
      opt.step();
      expect_step_matches(
          *comm, loss, norm, want, 0.5,
          "ZeRO-2 step " + std::to_string(step) + " bucket_bytes " + std::to_string(bucket_bytes));
    }
    expect_params_match_and_replicated(*comm, *model, *ref);
  }
}

// Property (Note [Optimizer offload]): offload moves the state, not the arithmetic. ZeRO-1 and
// ZeRO-2 with offload give parameters bitwise equal to the same runs without it after 3 steps
// with accumulation and clipping (on the CPU backend both run the same kernels; a step that did
// not copy the gradient to the host, or the masters back, would differ by O(lr)). The host
// holds 16 bytes per shard element (master, both moments, the gradient copy) in tensors of
// their own, none sharing storage with the device shards; without offload it holds none. The
// masters (parameters' own slices on the device) are bitwise the same arithmetic either way.
TEST(Offload, BitwiseEqualToOnDevice) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  for (bool zero2 : {false, true}) {
    auto a = tiny_gpt(models::Arch::Llama);
    auto b = tiny_gpt(models::Arch::Llama);
    DDPOptions o = zero2_options(4096);
    o.shard_grads = zero2;
    DistributedDataParallel ddp_a(a->named_parameters(), comm, o);
    DistributedDataParallel ddp_b(b->named_parameters(), comm, o);
    optim::AdamWOptions ao;
    ao.lr = 3e-3;
    DistributedOptimizer opt_a(ddp_a, dp_test::adamw_groups(*a, 0.1), ao);
    DistributedOptimizer opt_b(ddp_b, dp_test::adamw_groups(*b, 0.1), ao, {.offload = true});
    int64_t shard = 0;
    for (const auto& pc : opt_b.pieces()) {
      shard += pc.numel;
      EXPECT_FALSE(pc.master.shares_storage(pc.grad) || pc.host_grad.shares_storage(pc.grad));
    }
    EXPECT_EQ(opt_b.host_state_bytes(), 16 * shard);
    EXPECT_EQ(opt_a.host_state_bytes(), 0);
    // On the device the masters are the parameters (Note [Masters are the parameters]); the
    // host keeps a master copy besides both moments.
    EXPECT_EQ(opt_b.optimizer_state_bytes() * 8, opt_a.optimizer_state_bytes() * 12);
    for (int step = 0; step < 3; ++step) {
      Batch global = global_batch(kRowsPerRank * n, 60 + step);
      using Run = std::tuple<models::GPT*, DistributedDataParallel*, DistributedOptimizer*>;
      for (auto [m, d, opt] :
           std::vector<Run>{{a.get(), &ddp_a, &opt_a}, {b.get(), &ddp_b, &opt_b}}) {
        opt->zero_grad();
        two_microbatch_step(*m, *d, global, r);
        opt->clip_grad_norm(0.5);
        opt->step();
      }
    }
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(to_vector<float>(pa[i].second), to_vector<float>(pb[i].second))
          << pa[i].first << (zero2 ? " (ZeRO-2)" : " (ZeRO-1)");
    }
  }
}

}  // namespace
}  // namespace td::distributed
