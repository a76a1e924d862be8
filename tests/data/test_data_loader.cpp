// DataLoader: batches are the dataset's samples in Megatron's pretraining-sampler order, data-
// parallel ranks partition each global batch, resuming from consumed_samples continues exactly,
// prefetch depth does not change results, and errors from the loader thread reach next().
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/data/data_loader.h"
#include "test_util.h"

using td::data::DataLoader;
using td::data::GPTDataset;
using td::data::IndexedDataset;
using td::data::IndexedDatasetBuilder;

namespace {

class LoaderTest : public td::test::TempDirTest {
 protected:
  void SetUp() override {
    const std::string prefix = path("ds");
    IndexedDatasetBuilder b(prefix, td::data::kDTypeUInt16);
    int64_t next = 0;
    for (int d = 0; d < 25; ++d) {
      std::vector<int64_t> seq(static_cast<size_t>(3 + (d * 7) % 11));
      for (auto& t : seq) t = next++ % 60000;
      b.add_sequence(seq.data(), static_cast<int64_t>(seq.size()));
      b.end_document();
    }
    b.finalize();
    auto ds = std::make_shared<const IndexedDataset>(prefix);
    gpt_ = std::make_shared<const GPTDataset>(ds, 0, 25, kSeqLen, 42);
  }

  // Row r of batch `b` must be global sample `i` of the dataset.
  void expect_row(const td::Tensor& b, int64_t r, int64_t i) const {
    std::vector<int64_t> want(kSeqLen + 1);
    gpt_->sample(i, want.data());
    const int64_t* p = b.data_ptr<int64_t>() + r * (kSeqLen + 1);
    for (int64_t t = 0; t <= kSeqLen; ++t)
      ASSERT_EQ(p[t], want[t]) << "row " << r << " sample " << i;
  }

  static std::vector<int64_t> flat(const td::Tensor& t) {
    return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
  }

  static constexpr int64_t kSeqLen = 6;
  std::shared_ptr<const GPTDataset> gpt_;
};

}  // namespace

// Step t of a single rank holds samples [t*mb, (t+1)*mb), across several epochs.
TEST_F(LoaderTest, BatchesAreDatasetSamples) {
  const int64_t mb = 3, S = gpt_->samples_per_epoch();
  DataLoader loader(gpt_, mb);
  const int64_t steps = 3 * S / mb + 2;  // past two epoch boundaries
  for (int64_t t = 0; t < steps; ++t) {
    const td::Tensor b = loader.next();
    ASSERT_EQ(b.dtype(), td::DType::Int64);
    ASSERT_EQ(b.sizes(), (td::Shape{mb, kSeqLen + 1}));
    for (int64_t r = 0; r < mb; ++r) expect_row(b, r, t * mb + r);
    EXPECT_EQ(loader.consumed_samples(), (t + 1) * mb);
  }
}

// With dp_size 3, the ranks' step-t batches are consecutive slices of global batch t.
TEST_F(LoaderTest, DataParallelRanksPartitionTheGlobalBatch) {
  const int64_t mb = 2, dp = 3, start = 5;
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int64_t r = 0; r < dp; ++r)
    ranks.push_back(std::make_unique<DataLoader>(gpt_, mb, r, dp, start));
  for (int64_t t = 0; t < 7; ++t) {
    for (int64_t r = 0; r < dp; ++r) {
      const td::Tensor b = ranks[r]->next();
      for (int64_t k = 0; k < mb; ++k) expect_row(b, k, start + t * mb * dp + r * mb + k);
      EXPECT_EQ(ranks[r]->consumed_samples(), start + (t + 1) * mb * dp);  // global count
    }
  }
}

// A loader built with the consumed_samples of a checkpoint yields exactly the batches the
// original loader yields after that point; prefetch depth changes nothing.
TEST_F(LoaderTest, ResumeAndPrefetchAreExact) {
  const int64_t mb = 4, dp = 2;
  std::vector<std::vector<int64_t>> ref;
  int64_t consumed_after_3 = -1;
  {
    DataLoader a(gpt_, mb, 1, dp, 0, 1);
    for (int t = 0; t < 10; ++t) {
      ref.push_back(flat(a.next()));
      if (t == 2) consumed_after_3 = a.consumed_samples();
    }
  }
  ASSERT_EQ(consumed_after_3, 3 * mb * dp);
  DataLoader deep(gpt_, mb, 1, dp, 0, 4);
  for (int t = 0; t < 10; ++t) EXPECT_EQ(flat(deep.next()), ref[t]) << "prefetch 4, step " << t;
  DataLoader resumed(gpt_, mb, 1, dp, consumed_after_3, 3);
  EXPECT_EQ(resumed.consumed_samples(), consumed_after_3);
  for (int t = 3; t < 10; ++t) EXPECT_EQ(flat(resumed.next()), ref[t]) << "resumed, step " << t;
}

// An error raised in the loader thread (here: an epoch index beyond 2^32) is rethrown by next(),
// on every later call too; a loader destroyed with a full queue or mid-way stops cleanly.
TEST_F(LoaderTest, ErrorsAndShutdown) {
  const int64_t S = gpt_->samples_per_epoch();
  const int64_t huge = S * ((int64_t{1} << 32) + 1);
  DataLoader bad(gpt_, 2, 0, 1, huge);
  for (int k = 0; k < 2; ++k) {
    try {
      bad.next();
      ADD_FAILURE() << "expected td::Error";
    } catch (const td::Error& e) {
      EXPECT_NE(std::string(e.what()).find("epoch"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(bad.consumed_samples(), huge);
  { DataLoader idle(gpt_, 2, 0, 1, 0, 2); }  // never read: the worker waits on a full queue
  {
    DataLoader partial(gpt_, 2, 0, 1, 0, 3);
    partial.next();
  }
  EXPECT_THROW(DataLoader(gpt_, 0), td::Error);
  EXPECT_THROW(DataLoader(gpt_, 2, 2, 2), td::Error);
  EXPECT_THROW(DataLoader(gpt_, 2, 0, 1, -1), td::Error);
  EXPECT_THROW(DataLoader(gpt_, 2, 0, 1, 0, 0), td::Error);
  EXPECT_THROW(DataLoader(nullptr, 2), td::Error);
}
