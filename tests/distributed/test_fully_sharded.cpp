// td::distributed::FullyShardedDataParallel (ZeRO-3), run under mpirun at 2 and 4 ranks.
//
// The reference is single-process training on the whole global batch (td::optim::AdamW and
// clip_grad_norm_), computed on every rank. Tolerances: Note [DP tolerance] in
// data_parallel_test_util.h.
#include <gtest/gtest.h>

#include "data_parallel_test_util.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/distributed/distributed_optimizer.h"
#include "tardelli/distributed/fully_sharded.h"
#include "tardelli/ops/elementwise.h"

namespace td::distributed {
namespace {

using namespace dp_test;

std::shared_ptr<models::GPT> four_layer_gpt(models::Arch arch) {
  models::GPTConfig c = tiny_gpt_config(arch);
  c.n_layer = 4;
  return std::make_shared<models::GPT>(c);
}

int64_t unit_numel(const nn::NamedTensors& u) {
  int64_t n = 0;
  for (const auto& [name, p] : u) n += p.numel();
  return n;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Property: 3 ZeRO-3 steps with 2 micro-batches each (clipping active) match 3 single-process
// steps on the whole batch: losses and grad norms at 1e-5 relative, and for llama the gathered
// parameters at kParamRtol (gpt2's key bias is rounding noise under Adam, Note [DP tolerance]:
// its losses are compared, which also exercises the tied head re-gathering unit 0). After
// every step no parameter is gathered any more, and every rank gathers the same values.
TEST(FSDP, AccumulatedStepsMatchSingleProcess) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  for (auto arch : {models::Arch::Llama, models::Arch::GPT2}) {
    const std::string what = arch == models::Arch::Llama ? "llama" : "gpt2";
    auto ref = four_layer_gpt(arch);
    auto model = four_layer_gpt(arch);
    optim::AdamWOptions ao;
    ao.lr = 3e-3;
    optim::AdamW ref_opt(dp_test::adamw_groups(*ref, 0.1), ao);
    auto groups = dp_test::adamw_groups(*model, 0.1);
    auto fsdp = FullyShardedDataParallel::shard({model}, comm);
    DistributedOptimizer opt(fsdp->ddp(), groups, ao, fsdp->optimizer_options());
    for (int step = 0; step < 3; ++step) {
      Batch global = global_batch(kRowsPerRank * n, 80 + step);
      const StepResult want = reference_step(*ref, ref_opt, global, 0.5);
      opt.zero_grad();
      double total = 0;
      for (int m = 0; m < 2; ++m) {
        Batch mb = global.rows(r * kRowsPerRank + m, 1);
        Tensor loss = model->forward(mb.idx, mb.targets);
        mul(loss, 0.5).backward();
        total += 0.5 * loss.item_double();
      }
      fsdp->ddp().finish_grad_sync();
      EXPECT_EQ(fsdp->gathered_bytes(), 0) << what << " step " << step;
      const double norm = opt.clip_grad_norm(0.5);
      opt.step();
      expect_step_matches(*comm, full({1}, total), norm, want, 0.5,
                          what + " step " + std::to_string(step));
    }
    nn::NamedTensors got = fsdp->full_parameters();
    auto ref_params = ref->named_parameters();
    ASSERT_EQ(got.size(), ref_params.size());
    std::map<std::string, Tensor> by_name(got.begin(), got.end());
    for (const auto& [name, p] : ref_params) {
      ASSERT_TRUE(by_name.count(name)) << name;
      if (arch == models::Arch::Llama) expect_close(by_name[name], p, name, kParamRtol);
      Tensor hi = by_name[name].clone(), lo = hi.clone();
      comm->all_reduce(hi, ReduceOp::Max);
      comm->all_reduce(lo, ReduceOp::Min);
      EXPECT_EQ(to_vector<float>(hi), to_vector<float>(lo)) << name << " differs across ranks";
    }
  }
}

// Property: between uses no parameter holds bytes: every parameter's storage is released and
// reading one is a td::Error naming the release; a forward gathers each non-empty unit once
// (gpt2's tied head gathers wte again) and leaves nothing gathered; the most gathered at once,
// forward and backward with prefetch, stays within wte + wpe + head + two blocks (the current
// unit and the prefetched one), below the full model's parameters, and after the step the
// allocator holds no more than before it (gathered buffers really freed); the shards hold 1/dp of
// the parameters each (up to each unit's padding to a multiple of dp); generate is refused.
TEST(FSDP, ParametersLiveInShardsBetweenUses) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  auto model = four_layer_gpt(models::Arch::GPT2);
  const auto units = model->param_units();
  ASSERT_EQ(units.size(), 7u);  // wte, wpe, 4 blocks, head
  int64_t total = 0, largest_block = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    total += unit_numel(units[k]);
    if (k >= 2 && k < 6) largest_block = std::max(largest_block, unit_numel(units[k]));
  }
  auto fsdp = FullyShardedDataParallel::shard({model}, comm);
  int64_t shard_numel = 0;
  for (const Tensor& s : fsdp->param_shards()) shard_numel += s.numel();
  EXPECT_LE(shard_numel * n, total + 7 * n);
  EXPECT_GE(shard_numel * n, total);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_TRUE(p.storage().released()) << name;
  }
  const Tensor wte = model->named_parameters()[0].second;
  EXPECT_NE(error_of([&] { (void)to_vector<float>(wte); }).find("released"), std::string::npos);

  Batch b = global_batch(kRowsPerRank * n, 5).rows(r * kRowsPerRank, kRowsPerRank);
  {
    autograd::NoGradGuard ng;
    const int64_t g0 = fsdp->num_gathers();
    model->forward(b.idx, b.targets);
    EXPECT_EQ(fsdp->num_gathers() - g0, 8);
    EXPECT_EQ(fsdp->gathered_bytes(), 0);
  }
  fsdp->reset_peak_gathered_bytes();
  fsdp->ddp().zero_grad();
  const int64_t before = memory_stats().current_bytes;
  model->forward(b.idx, b.targets).backward();
  fsdp->ddp().finish_grad_sync();
  EXPECT_EQ(fsdp->gathered_bytes(), 0);
  // The allocator agrees: no gathered buffer or full gradient bucket outlives the step.
  EXPECT_LT(memory_stats().current_bytes - before, 4 * largest_block / 4);
  const int64_t bound = 4 * (unit_numel(units[0]) + unit_numel(units[1]) + unit_numel(units[6]) +
                             2 * largest_block + 4 * n);
  EXPECT_LE(fsdp->peak_gathered_bytes(), bound);
  EXPECT_LT(bound, 4 * total);
  EXPECT_NE(error_of([&] { model->generate(b.idx, 1); }).find("sharded"), std::string::npos);
}

// Property: full_parameters() gathers the values the model was built with (bitwise), and
// load_full_parameters() replaces them (each rank keeping its shard): a forward after loading
// another model's parameters gives that model's loss bitwise.
TEST(FSDP, FullParametersRoundTrip) {
  CommPtr comm = world();
  auto fresh = tiny_gpt(models::Arch::Llama);
  auto model = tiny_gpt(models::Arch::Llama);
  auto fsdp = FullyShardedDataParallel::shard({model}, comm);
  for (const auto& [name, p] : fsdp->full_parameters()) {
    bool found = false;
    for (const auto& [n2, q] : fresh->named_parameters()) {
      if (n2 != name) continue;
      found = true;
      EXPECT_EQ(to_vector<float>(p), to_vector<float>(q)) << name;
    }
    EXPECT_TRUE(found) << name;
  }
  models::GPTConfig c = tiny_gpt_config(models::Arch::Llama);
  c.seed = 99;
  auto other = std::make_shared<models::GPT>(c);
  std::map<std::string, Tensor> values;
  for (const auto& [name, p] : other->named_parameters()) values[name] = p;
  fsdp->load_full_parameters(values);
  Batch b = global_batch(2, 9);
  autograd::NoGradGuard ng;
  EXPECT_EQ(model->forward(b.idx, b.targets).item<float>(),
            other->forward(b.idx, b.targets).item<float>());
  values.erase(values.begin());
  EXPECT_NE(error_of([&] { fsdp->load_full_parameters(values); }).find("no value for"),
            std::string::npos);
}

// Property (Note [Compute-dtype gathers]): a bf16 model's blocks and head are gathered in bf16
// while the fp32 parameters never hold bytes, and nothing else changes: the ops see the same
// bf16 weights as the unsharded bf16 model's casts, so with the same rows on every rank the loss
// is bitwise equal and so is every rank's averaged gradient shard (identical values averaged over
// 2 or 4 ranks are exact). The most gathered at once stays within the fp32 tables plus 2-byte
// copies of the head and two blocks, below the same bound in fp32.
TEST(FSDP, Bf16GathersMatchUnshardedBf16) {
  CommPtr comm = world();
  const int r = comm->rank();
  models::GPTConfig c = tiny_gpt_config(models::Arch::Llama);
  c.n_layer = 4;
  c.dtype = DType::BFloat16;
  auto ref = std::make_shared<models::GPT>(c);
  auto model = std::make_shared<models::GPT>(c);
  const auto units = model->param_units();
  int64_t largest_block = 0;
  for (size_t k = 2; k + 1 < units.size(); ++k) {
    largest_block = std::max(largest_block, unit_numel(units[k]));
  }
  auto fsdp = FullyShardedDataParallel::shard({model}, comm);
  fsdp->ddp().zero_grad();
  fsdp->reset_peak_gathered_bytes();
  Batch b = global_batch(2, 11);  // the same rows everywhere
  Tensor loss = model->forward(b.idx, b.targets);
  Tensor ref_loss = ref->forward(b.idx, b.targets);
  EXPECT_EQ(loss.item<float>(), ref_loss.item<float>());
  loss.backward();
  ref_loss.backward();
  fsdp->ddp().finish_grad_sync();
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_TRUE(p.storage().released()) << name;
  }
  std::map<std::string, Tensor> ref_grads;
  for (const auto& [name, p] : ref->named_parameters()) ref_grads[name] = p.grad();
  const auto& ddp = fsdp->ddp();
  int64_t compared = 0;
  for (size_t bk = 0; bk < ddp.buckets().size(); ++bk) {
    const Bucket& bucket = ddp.buckets()[bk];
    const int64_t lo = r * bucket.shard_numel, hi = lo + bucket.shard_numel;
    std::vector<float> shard = to_vector<float>(ddp.shard_grad(bk));
    for (size_t i : bucket.params) {
      const BucketParam& p = ddp.params()[i];
      std::vector<float> want = to_vector<float>(ref_grads.at(p.name));
      for (int64_t e = std::max(lo, p.offset); e < std::min(hi, p.offset + p.numel); ++e) {
        ASSERT_EQ(shard[static_cast<size_t>(e - lo)], want[static_cast<size_t>(e - p.offset)])
            << p.name << " element " << e - p.offset;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
  const int64_t tables = unit_numel(units[0]) + unit_numel(units[1]);
  const int64_t bound16 = 4 * tables + 2 * (unit_numel(units.back()) + 2 * largest_block) + 64;
  EXPECT_LE(fsdp->peak_gathered_bytes(), bound16);
  EXPECT_LT(bound16, 4 * (tables + unit_numel(units.back()) + 2 * largest_block));
}

// Property (Note [Stale gathers]): a unit still gathered when the optimizer writes new values
// into the shards (here block 0, gathered by hand after backward, as a prefetch nobody used
// would be) is dropped by the step, and its next gather holds the updated values, equal to the
// full parameters the shards now give. Without the drop the next forward would silently train
// on the previous step's weights.
TEST(FSDP, OptimizerStepDropsStaleGathers) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  auto model = four_layer_gpt(models::Arch::Llama);
  auto groups = dp_test::adamw_groups(*model, 0.1);
  auto fsdp = FullyShardedDataParallel::shard({model}, comm);
  optim::AdamWOptions ao;
  ao.lr = 1e-2;
  DistributedOptimizer opt(fsdp->ddp(), groups, ao, fsdp->optimizer_options());
  Batch b = global_batch(kRowsPerRank * n, 7).rows(r * kRowsPerRank, kRowsPerRank);
  opt.zero_grad();
  model->forward(b.idx, b.targets).backward();
  fsdp->ddp().finish_grad_sync();
  const int64_t block0 = 2;  // Note [GPT parameter units]: wte, wpe (empty for llama), blocks
  fsdp->materialize(block0);
  ASSERT_GT(fsdp->gathered_bytes(), 0);
  const auto unit = model->param_units()[static_cast<size_t>(block0)];
  ASSERT_FALSE(unit.empty());
  const Tensor before = unit[0].second.clone();
  opt.step();
  EXPECT_EQ(fsdp->gathered_bytes(), 0) << "the step left a unit gathered from old values";
  std::map<std::string, Tensor> full_now;
  for (auto& [name, p] : fsdp->full_parameters()) full_now[name] = p;
  fsdp->materialize(block0);
  const Tensor after = unit[0].second.clone();
  {
    autograd::NoGradGuard ng;
    fsdp->release({block0}, zeros({1}));
  }
  EXPECT_EQ(to_vector<float>(after), to_vector<float>(full_now.at(unit[0].first))) << unit[0].first;
  EXPECT_NE(to_vector<float>(after), to_vector<float>(before)) << "the step changed nothing";
}

}  // namespace
}  // namespace td::distributed
