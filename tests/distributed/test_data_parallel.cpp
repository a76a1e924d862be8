// td::distributed::DistributedDataParallel, run under mpirun at 2 and 4 ranks.
//
// Every rank builds the same global batch and, as the reference, the single-process gradient of
// the mean loss over that whole batch; its DDP replica sees only its own rows. Tolerances:
// Note [DP tolerance] in data_parallel_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "data_parallel_test_util.h"
#include "tardelli/autograd/grad_mode.h"
#include "tardelli/distributed/data_parallel.h"
#include "tardelli/ops/copy.h"
#include "tardelli/ops/elementwise.h"
#include "tardelli/ops/matmul.h"
#include "tardelli/ops/reduction.h"

namespace td::distributed {
namespace {

using namespace dp_test;

// The reference: gradients of the mean loss over all rows, in one process.
nn::NamedTensors reference_grads(const Batch& b) {
  auto ref = tiny_gpt();
  ref->forward(b.idx, b.targets).backward();
  nn::NamedTensors out;
  for (const auto& [n, p] : ref->named_parameters()) out.emplace_back(n, p.grad());
  return out;
}

struct Mode {
  const char* name;
  int64_t bucket_bytes;
  bool overlap, reduce_scatter;
};

class DDPGrads : public ::testing::TestWithParam<Mode> {};

// Property: after backward on rank r's rows and finish_grad_sync(), each gradient equals the
// single-process gradient of the mean loss over the whole global batch (all_reduce: everywhere;
// reduce_scatter: on this rank's shard of each bucket), for one big bucket and for many tiny
// ones, with and without overlap; exactly one collective per bucket is issued.
TEST_P(DDPGrads, MatchSingleProcessGlobalBatch) {
  const Mode mode = GetParam();
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  Batch global = global_batch(kRowsPerRank * n, 0);
  nn::NamedTensors ref = reference_grads(global);

  auto model = tiny_gpt();
  DistributedDataParallel ddp(model->named_parameters(), comm,
                              {mode.bucket_bytes, mode.overlap, mode.reduce_scatter, true});
  if (mode.bucket_bytes < 100000) {
    EXPECT_GT(ddp.buckets().size(), 5u);
  } else {
    EXPECT_EQ(ddp.buckets().size(), 1u);
  }
  ddp.zero_grad();
  Batch local = global.rows(r * kRowsPerRank, kRowsPerRank);
  model->forward(local.idx, local.targets).backward();
  ddp.finish_grad_sync();
  EXPECT_TRUE(ddp.grads_synced());
  EXPECT_EQ(ddp.num_collectives(), static_cast<int64_t>(ddp.buckets().size()));

  const auto& params = ddp.params();
  ASSERT_EQ(params.size(), ref.size());
  if (!mode.reduce_scatter) {
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].name, ref[i].first);
      expect_close(params[i].param.grad(), ref[i].second, params[i].name);
    }
    return;
  }
  // The reference laid out like the buckets; compare this rank's shard of each.
  for (const auto& bk : ddp.buckets()) {
    Tensor ref_buf = zeros({bk.padded_numel});
    for (size_t i : bk.params) {
      copy_into(ref_buf.narrow(0, params[i].offset, params[i].numel), ref[i].second.reshape({-1}));
    }
    expect_close(bk.buffer.narrow(0, r * bk.shard_numel, bk.shard_numel),
                 ref_buf.narrow(0, r * bk.shard_numel, bk.shard_numel), "shard");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DDPGrads,
                         ::testing::Values(Mode{"allreduce_tiny_overlap", 4096, true, false},
                                           Mode{"allreduce_one_bucket", 40'000'000, true, false},
                                           Mode{"allreduce_tiny_no_overlap", 4096, false, false},
                                           Mode{"reduce_scatter_tiny", 4096, true, true},
                                           Mode{"reduce_scatter_one_bucket", 40'000'000, true,
                                                true}),
                         [](const auto& info) { return std::string(info.param.name); });

// Property: with two micro-batches per rank and set_last_microbatch(false) on the first, the
// first backward issues no collective, the last issues one per bucket, and the accumulated,
// averaged gradient equals the single-process gradient of the global batch (loss scaled by 1/2
// per micro-batch, as a train loop does).
TEST(DDP, GradientAccumulationCommunicatesOnLastMicrobatchOnly) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  Batch global = global_batch(2 * kRowsPerRank * n, 1);
  nn::NamedTensors ref = reference_grads(global);

  auto model = tiny_gpt();
  DistributedDataParallel ddp(model->named_parameters(), comm, {8192, true, false, true});
  const int64_t nb = static_cast<int64_t>(ddp.buckets().size());
  ddp.zero_grad();
  for (int m = 0; m < 2; ++m) {
    ddp.set_last_microbatch(m == 1);
    Batch mb = global.rows((2 * r + m) * kRowsPerRank, kRowsPerRank);
    mul(model->forward(mb.idx, mb.targets), 0.5).backward();
    EXPECT_EQ(ddp.num_collectives(), m == 0 ? 0 : nb) << "after micro-batch " << m;
  }
  ddp.finish_grad_sync();
  EXPECT_EQ(ddp.num_collectives(), nb);
  for (size_t i = 0; i < ddp.params().size(); ++i) {
    expect_close(ddp.params()[i].param.grad(), ref[i].second, ddp.params()[i].name);
  }
}

// Property: with overlap, the first bucket's reduction is launched from a hook while backward is
// still producing gradients (fewer hooks had fired than there are parameters); without overlap
// every bucket is launched after the last hook.
TEST(DDP, OverlapLaunchesBeforeBackwardEnds) {
  CommPtr comm = world();
  const int r = comm->rank();
  Batch local = global_batch(kRowsPerRank * comm->size(), 2).rows(r * kRowsPerRank, kRowsPerRank);
  for (bool overlap : {true, false}) {
    auto model = tiny_gpt();
    DistributedDataParallel ddp(model->named_parameters(), comm, {4096, overlap, false, true});
    ddp.zero_grad();
    model->forward(local.idx, local.targets).backward();
    ddp.finish_grad_sync();
    const int64_t hooks = ddp.hooks_fired();
    EXPECT_EQ(hooks, static_cast<int64_t>(ddp.params().size()));  // every parameter is used
    std::vector<int64_t> at = ddp.launch_hook_counts();
    ASSERT_EQ(at.size(), ddp.buckets().size());
    for (size_t b = 1; b < at.size(); ++b) EXPECT_LE(at[b - 1], at[b]) << "launch order";
    if (overlap) {
      EXPECT_GE(at[0], 1);
      EXPECT_LT(at[0], hooks) << "bucket 0 was not launched before backward finished";
      EXPECT_LT(at[at.size() / 2], hooks);
    } else {
      for (int64_t a : at) EXPECT_EQ(a, hooks);
    }
  }
}

// A two-layer MLP over plain tensors plus a parameter `u` that only rank 0 uses: rank 0's
// bucket holding `u` becomes ready in backward, the other ranks' only in finish_grad_sync. The
// in-order launch keeps the collectives aligned (no hang, no mismatch), the unused gradient
// stays a zero-filled view, and the averages are right: u's is rank 0's gradient / size.
TEST(DDP, ParameterUnusedOnSomeRanksDoesNotHang) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  Generator gen(5);
  Tensor w1 = randn({8, 16}, {}, &gen), b1 = randn({16}, {}, &gen), u = randn({5}, {}, &gen),
         w2 = randn({16, 4}, {}, &gen);
  Tensor x = randn({4 * n, 8}, {}, &gen);
  auto f = [&](const Tensor& xs) { return mean(pow(mm(tanh(add(mm(xs, w1), b1)), w2), 2.0)); };
  nn::NamedTensors named = {{"w1", w1}, {"b1", b1}, {"u", u}, {"w2", w2}};
  for (auto& [name, t] : named) t.set_requires_grad(true);
  f(x).backward();  // the reference over all rows (gradients copied into the buckets below)
  TensorList ref;
  for (auto& [name, t] : named) ref.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
  for (auto& [name, t] : named) t.set_grad(Tensor());

  DistributedDataParallel ddp(named, comm, {1, true, false, true});  // one bucket per parameter
  ASSERT_EQ(ddp.buckets().size(), 4u);
  ddp.zero_grad();
  Tensor loss = f(x.narrow(0, 4 * r, 4));
  if (r == 0) loss = add(loss, mul(sum(mul(u, u)), 0.1));
  loss.backward();
  ddp.finish_grad_sync();
  EXPECT_EQ(ddp.num_collectives(), 4);
  expect_close(w1.grad(), ref[0], "w1");
  expect_close(b1.grad(), ref[1], "b1");
  expect_close(w2.grad(), ref[3], "w2");
  expect_close(u.grad(), mul(u.detach(), 0.2 / n), "u");
  // A backward that uses nothing: finish_grad_sync alone launches every bucket.
  ddp.zero_grad();
  ddp.finish_grad_sync();
  EXPECT_EQ(ddp.num_collectives(), 8);
  EXPECT_EQ(to_vector<float>(u.grad()), std::vector<float>(5, 0.0f));
}

// Property: zero_grad keeps the views and a second step gives the same synchronized gradient
// as the first (no stale accumulation), and finish_grad_sync twice in a row is harmless.
TEST(DDP, ZeroGradKeepsViewsAndRepeats) {
  CommPtr comm = world();
  const int r = comm->rank();
  Batch global = global_batch(kRowsPerRank * comm->size(), 3);
  nn::NamedTensors ref = reference_grads(global);
  auto model = tiny_gpt();
  DistributedDataParallel ddp(model->named_parameters(), comm, {16384, true, false, true});
  Batch local = global.rows(r * kRowsPerRank, kRowsPerRank);
  for (int rep = 0; rep < 2; ++rep) {
    ddp.zero_grad();
    model->forward(local.idx, local.targets).backward();
    ddp.finish_grad_sync();
    for (size_t i = 0; i < ref.size(); ++i) {
      expect_close(ddp.params()[i].param.grad(), ref[i].second, ddp.params()[i].name);
    }
  }
  ddp.finish_grad_sync();  // nothing new: reduces the already averaged gradient again
  expect_close(ddp.params()[0].param.grad(), ref[0].second, "after a repeated sync");
}

// Property: grad_scale multiplies the local gradients before the reduction, so the result is
// the average times the scale (all_reduce and ZeRO-1 shards alike; 0.5 is exact in binary, so
// the tolerance is the plain DDP one); a non-positive or non-finite scale is refused.
TEST(DDP, GradScaleScalesTheAverage) {
  CommPtr comm = world();
  const int r = comm->rank();
  Batch global = global_batch(kRowsPerRank * comm->size(), 5);
  nn::NamedTensors ref = reference_grads(global);
  Batch local = global.rows(r * kRowsPerRank, kRowsPerRank);
  for (bool rs : {false, true}) {
    auto model = tiny_gpt();
    DDPOptions o{8192, true, rs, true};
    o.grad_scale = 0.5;
    DistributedDataParallel ddp(model->named_parameters(), comm, o);
    model->forward(local.idx, local.targets).backward();
    ddp.finish_grad_sync();
    for (size_t i = 0; i < ref.size(); ++i) {
      const BucketParam& bp = ddp.params()[i];
      Tensor want = mul(ref[i].second, 0.5).reshape({-1});
      if (!rs) {
        expect_close(bp.param.grad(), mul(ref[i].second, 0.5), bp.name);
        continue;
      }
      // ZeRO-1: only this rank's shard of the bucket holds the result.
      const Bucket& bk = ddp.buckets()[bp.bucket];
      const int64_t lo = std::max<int64_t>(bp.offset, r * bk.shard_numel);
      const int64_t hi = std::min<int64_t>(bp.offset + bp.numel, (r + 1) * bk.shard_numel);
      if (lo >= hi) continue;
      expect_close(bk.buffer.narrow(0, lo, hi - lo), want.narrow(0, lo - bp.offset, hi - lo),
                   bp.name + " shard");
    }
  }
  Tensor a = zeros({3});
  a.set_requires_grad(true);
  for (double bad : {0.0, -1.0, std::nan("")}) {
    DDPOptions o;
    o.grad_scale = bad;
    try {
      DistributedDataParallel ddp({{"a", a}}, comm, o);
      FAIL() << "grad_scale " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("grad_scale must be finite and > 0"), std::string::npos)
          << e.what();
    }
  }
}

// Property: a gradient replaced behind the DDP's back (set to None, as torch's
// zero_grad(set_to_none=True) does) is a td::Error naming the parameter, both from the hook in
// backward and from finish_grad_sync; every rank fails alike before any collective.
TEST(DDP, GradSetToNoneIsAnError) {
  CommPtr comm = world();
  auto model = tiny_gpt();
  DistributedDataParallel ddp(model->named_parameters(), comm, {4096, true, false, true});
  for (const auto& p : ddp.params()) p.param.set_grad(Tensor());
  Batch b = global_batch(2, 4);
  try {
    model->forward(b.idx, b.targets).backward();
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is no longer a view of its gradient bucket"),
              std::string::npos)
        << e.what();
  }
  try {
    ddp.finish_grad_sync();
    FAIL() << "expected a td::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'wte.weight'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ddp.num_collectives(), 0);
}

// Property: bad construction arguments are td::Errors with a clear message.
TEST(DDP, BadArguments) {
  CommPtr comm = world();
  Tensor a = zeros({3});
  a.set_requires_grad(true);
  auto msg = [&](const nn::NamedTensors& ps, CommPtr c, DDPOptions o) -> std::string {
    try {
      DistributedDataParallel ddp(ps, std::move(c), o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg({{"a", a}}, nullptr, {}).find("communicator is null"), std::string::npos);
  EXPECT_NE(msg({}, comm, {}).find("no parameters"), std::string::npos);
  EXPECT_NE(msg({{"a", a}}, comm, {0}).find("bucket_bytes must be > 0"), std::string::npos);
  EXPECT_NE(msg({{"a", a}, {"b", a}}, comm, {}).find("'a' and 'b' are the same tensor"),
            std::string::npos);
  Tensor h = zeros({3}, {DType::BFloat16});
  h.set_requires_grad(true);
  EXPECT_NE(msg({{"h", h}}, comm, {}).find("only float32 parameters"), std::string::npos);
  Tensor c = zeros({3});
  EXPECT_NE(msg({{"c", c}}, comm, {}).find("must be a leaf tensor that requires grad"),
            std::string::npos);
}

// Property: 5 AdamW steps (clipping at a norm that bites) with DDP and td::optim::AdamW give the
// same losses and parameters as 5 single-process steps on the full batch, and the replicas stay
// bitwise identical across ranks (every rank applies the same update to the same gradient).
TEST(DDP, FiveAdamWStepsMatchSingleProcess) {
  CommPtr comm = world();
  const int r = comm->rank(), n = comm->size();
  auto ref = tiny_gpt(models::Arch::Llama);
  auto model = tiny_gpt(models::Arch::Llama);
  optim::AdamWOptions ao;
  ao.lr = 3e-3;
  optim::AdamW ref_opt(dp_test::adamw_groups(*ref, 0.1), ao);
  DistributedDataParallel ddp(model->named_parameters(), comm, {16384, true, false, true});
  optim::AdamW opt(dp_test::adamw_groups(*model, 0.1), ao);
  for (int step = 0; step < 5; ++step) {
    Batch global = global_batch(kRowsPerRank * n, 10 + step);
    const StepResult want = reference_step(*ref, ref_opt, global, 0.5);

    ddp.zero_grad();
    Tensor loss = local_forward_backward(*model, ddp, global, r);
    const double norm = optim::clip_grad_norm_(model->parameters(), 0.5);
    opt.step();
    expect_step_matches(*comm, loss, norm, want, 0.5, "step " + std::to_string(step));
    // From step 1 on the parameters themselves differ by rounding, so only the first step's
    // gradients are a like-for-like comparison (Note [DP tolerance]).
    if (step == 0) expect_grads_match(*model, *ref, "step 0");
  }
  expect_params_match_and_replicated(*comm, *model, *ref);
}

}  // namespace
}  // namespace td::distributed
