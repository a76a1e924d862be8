// split_documents (Megatron's rounding rule) and GPTDataset: every epoch is a permutation of the
// documents, cut into windows that cover the stream exactly once; determinism from the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/data/gpt_dataset.h"
#include "test_util.h"

using td::data::GPTDataset;
using td::data::IndexedDataset;
using td::data::IndexedDatasetBuilder;

namespace {

// Writes `num_docs` documents of 1-3 sequences with lengths in [0, max_len] (so some documents
// are empty); token values count up from 0, so every token identifies its position in the
// dataset and a sample's content tells where it came from.
std::shared_ptr<const IndexedDataset> make_dataset(const std::string& prefix, int num_docs,
                                                   int max_len, uint32_t structure_seed = 1) {
  IndexedDatasetBuilder b(prefix, td::data::kDTypeInt32);
  uint32_t s = structure_seed;
  auto rnd = [&](uint32_t n) {
    s = s * 1664525u + 1013904223u;
    return (s >> 8) % n;
  };
  int64_t next = 0;
  for (int d = 0; d < num_docs; ++d) {
    const uint32_t nseq = 1 + rnd(3);
    for (uint32_t q = 0; q < nseq; ++q) {
      std::vector<int64_t> seq(rnd(static_cast<uint32_t>(max_len) + 1));
      for (auto& t : seq) t = next++;
      b.add_sequence(seq.data(), static_cast<int64_t>(seq.size()));
    }
    b.end_document();
  }
  b.finalize();
  return std::make_shared<const IndexedDataset>(prefix);
}

std::vector<int64_t> document_tokens(const IndexedDataset& ds, int64_t doc) {
  std::vector<int64_t> r;
  for (int64_t s = ds.document_first(doc); s < ds.document_end(doc); ++s) {
    const td::Tensor t = ds.get(s);
    r.insert(r.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return r;
}

std::vector<int64_t> sample_of(const GPTDataset& g, int64_t i) {
  std::vector<int64_t> out(static_cast<size_t>(g.seq_len() + 1), -7);
  g.sample(i, out.data());
  return out;
}

}  // namespace

// Hand-computed cases of Megatron's rule: per-part round-half-even, then a common shift.
TEST(SplitDocuments, MegatronRounding) {
  auto bounds = [](int64_t n, std::vector<double> r) {
    const auto s = td::data::split_documents(n, std::move(r));
    EXPECT_EQ(s[0].end, s[1].begin);
    EXPECT_EQ(s[1].end, s[2].begin);
    return std::vector<int64_t>{s[0].begin, s[1].begin, s[2].begin, s[2].end};
  };
  EXPECT_EQ(bounds(1000, {98, 1, 1}), (std::vector<int64_t>{0, 980, 990, 1000}));
  // 10/3 = 3.33 -> 3 each, sum 9: every bound after the first shifts by +1.
  EXPECT_EQ(bounds(10, {1, 1, 1}), (std::vector<int64_t>{0, 4, 7, 10}));
  // 2.5 rounds to 2 (half to even), twice: [0,2,4,4] shifted by +1.
  EXPECT_EQ(bounds(5, {1, 1}), (std::vector<int64_t>{0, 3, 5, 5}));
  // 2/3 = 0.67 -> 1 each, sum 3: shifted by -1.
  EXPECT_EQ(bounds(2, {1, 1, 1}), (std::vector<int64_t>{0, 0, 1, 2}));
  // 3.5 rounds to 4 (half to even), twice: [0,4,8,8] shifted by -1.
  EXPECT_EQ(bounds(7, {0.5, 0.5, 0}), (std::vector<int64_t>{0, 3, 7, 7}));
  EXPECT_EQ(bounds(100, {949, 50, 1}), (std::vector<int64_t>{0, 95, 100, 100}));
  EXPECT_EQ(bounds(0, {98, 1, 1}), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(bounds(7, {1}), (std::vector<int64_t>{0, 7, 7, 7}));
  EXPECT_THROW(td::data::split_documents(10, {0, 0, 0}), td::Error);
  EXPECT_THROW(td::data::split_documents(10, {1, -1, 1}), td::Error);
  EXPECT_THROW(td::data::split_documents(10, {1, 1, 1, 1}), td::Error);
  EXPECT_THROW(td::data::split_documents(10, {}), td::Error);
}

// The core property, over two epochs: the epoch's document order is a permutation of the range;
// concatenating those documents gives the stream; sample j equals stream window
// [k*L, k*L + L + 1) for k = sample_order[j]; sample_order is a permutation of [0, S), so each
// stream position < S*L is an input position of exactly one sample, and each sample's targets
// (positions 1..L) are its inputs shifted by one. Epochs differ in both orders.
TEST(GPTDataset, EpochsCoverTheStreamOnce) {
  td::test::TempDir dir;
  const auto ds = make_dataset(dir.path("c"), 40, 30);
  const int64_t b = 5, e = 37, L = 16;
  const GPTDataset g(ds, b, e, L, 1234);
  int64_t n = 0;
  for (int64_t d = b; d < e; ++d) n += ds->document_length(d);
  ASSERT_EQ(g.tokens_per_epoch(), n);
  const int64_t S = (n - 1) / L;
  ASSERT_EQ(g.samples_per_epoch(), S);
  ASSERT_GT(S, 10);
  std::vector<std::vector<int64_t>> doc_orders, sample_orders;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto docs = g.document_order(epoch);
    auto sorted = docs;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> range(static_cast<size_t>(e - b));
    std::iota(range.begin(), range.end(), b);
    ASSERT_EQ(sorted, range) << "epoch " << epoch;
    std::vector<int64_t> stream;
    for (int64_t d : docs) {
      const auto t = document_tokens(*ds, d);
      stream.insert(stream.end(), t.begin(), t.end());
    }
    ASSERT_EQ(static_cast<int64_t>(stream.size()), n);
    std::map<int64_t, int64_t> pos_of;  // token -> stream position (tokens are unique)
    for (size_t p = 0; p < stream.size(); ++p) pos_of[stream[p]] = static_cast<int64_t>(p);

    const auto order = g.sample_order(epoch);
    std::vector<int> covered(static_cast<size_t>(S * L), 0);
    for (int64_t j = 0; j < S; ++j) {
      const auto s = sample_of(g, epoch * S + j);
      const int64_t k = order[j];
      ASSERT_TRUE(k >= 0 && k < S);
      for (int64_t t = 0; t <= L; ++t) ASSERT_EQ(s[t], stream[k * L + t]) << j << " " << t;
      const int64_t p0 = pos_of.at(s[0]);
      for (int64_t t = 0; t < L; ++t) {
        ASSERT_EQ(pos_of.at(s[t + 1]), pos_of.at(s[t]) + 1);  // target = next stream token
        ++covered[p0 + t];
      }
    }
    for (int64_t p = 0; p < S * L; ++p)
      ASSERT_EQ(covered[p], 1) << "epoch " << epoch << " pos " << p;
    doc_orders.push_back(docs);
    sample_orders.push_back(order);
  }
  EXPECT_NE(doc_orders[0], doc_orders[1]);
  EXPECT_NE(sample_orders[0], sample_orders[1]);
  // The document order is shuffled at all (32 documents: identity has probability 1/32!).
  std::vector<int64_t> identity(static_cast<size_t>(e - b));
  std::iota(identity.begin(), identity.end(), b);
  EXPECT_NE(doc_orders[0], identity);
}

// Same seed -> identical samples (also from a second instance and in any access order); another
// seed -> different order. Epochs far away are built lazily and stay consistent when revisited.
TEST(GPTDataset, DeterministicFromSeed) {
  td::test::TempDir dir;
  const auto ds = make_dataset(dir.path("d"), 30, 20);
  const GPTDataset a(ds, 0, 30, 8, 7), a2(ds, 0, 30, 8, 7), c(ds, 0, 30, 8, 8);
  const int64_t S = a.samples_per_epoch();
  std::vector<std::vector<int64_t>> first;
  for (int64_t i = 0; i < 2 * S; ++i) first.push_back(sample_of(a, i));
  for (int64_t i = 2 * S - 1; i >= 0; --i) EXPECT_EQ(sample_of(a2, i), first[i]);
  int differ = 0;
  for (int64_t i = 0; i < S; ++i) differ += sample_of(c, i) != first[i];
  EXPECT_GT(differ, S / 2);
  // Interleave epochs 0, 1000 and 1 (more than the two cached ones).
  const auto far = sample_of(a, 1000 * S + 3);
  EXPECT_EQ(sample_of(a, 3), first[3]);
  EXPECT_EQ(sample_of(a, S + 4), first[S + 4]);
  EXPECT_EQ(sample_of(a, 1000 * S + 3), far);
  EXPECT_EQ(sample_of(a2, 1000 * S + 3), far);
}

// Concurrent readers across several epochs see exactly the serial results.
TEST(GPTDataset, ThreadSafe) {
  td::test::TempDir dir;
  const auto ds = make_dataset(dir.path("t"), 30, 20);
  const GPTDataset g(ds, 0, 30, 8, 3);
  const GPTDataset ref(ds, 0, 30, 8, 3);
  const int64_t total = 6 * g.samples_per_epoch();
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(total));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t i = w; i < total; i += 4) got[i] = sample_of(g, (i * 7919) % total);
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t i = 0; i < total; ++i) EXPECT_EQ(got[i], sample_of(ref, (i * 7919) % total));
}

// The shuffle is uniform: over 24000 seeds each of the 6 orders of 3 documents appears about
// 4000 times (binomial sd 57.7). The bounds are 5 sd away, so a fair shuffle fails them with
// p < 4e-6 (and the seeds are fixed, so the test is deterministic), while the classic naive
// shuffle (swap with a uniform index over the whole array: orders with probability 4/27 or 5/27,
// i.e. 3556 or 4444 expected) is 7.7 sd outside, and an off-by-one Fisher-Yates (Sattolo's
// algorithm, never leaving an element in place) misses 4 orders entirely.
TEST(GPTDataset, DocumentShuffleIsUniform) {
  td::test::TempDir dir;
  IndexedDatasetBuilder b(dir.path("u"), td::data::kDTypeUInt16);
  for (int d = 0; d < 3; ++d) {
    const std::vector<int64_t> seq(5, d);
    b.add_sequence(seq.data(), 5);
    b.end_document();
  }
  b.finalize();
  const auto ds = std::make_shared<const IndexedDataset>(dir.path("u"));
  std::map<std::vector<int64_t>, int> counts;
  for (uint64_t seed = 0; seed < 24000; ++seed)
    counts[GPTDataset(ds, 0, 3, 4, seed).document_order(0)]++;
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [order, c] : counts) {
    EXPECT_GT(c, 3710);
    EXPECT_LT(c, 4290);
  }
}

// Bad arguments and too-short ranges are clear errors.
TEST(GPTDataset, RejectsBadArguments) {
  td::test::TempDir dir;
  IndexedDatasetBuilder b(dir.path("s"), td::data::kDTypeUInt16);
  const std::vector<int64_t> seq = {1, 2, 3, 4, 5};
  b.add_sequence(seq.data(), 5);
  b.end_document();
  b.add_sequence(seq.data(), 5);
  b.end_document();
  b.finalize();
  const auto ds = std::make_shared<const IndexedDataset>(dir.path("s"));
  try {
    GPTDataset g(ds, 0, 1, 5, 0);  // 5 tokens, a sample needs 6
    ADD_FAILURE() << "expected an error";
  } catch (const td::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hold 5 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("seq_len 5"), std::string::npos) << m;
  }
  const GPTDataset ok(ds, 0, 2, 4, 0);  // 10 tokens -> (10-1)/4 = 2 samples
  EXPECT_EQ(ok.samples_per_epoch(), 2);
  EXPECT_THROW(GPTDataset(ds, 1, 1, 2, 0), td::Error);
  EXPECT_THROW(GPTDataset(ds, 0, 3, 2, 0), td::Error);
  EXPECT_THROW(GPTDataset(ds, 0, 2, 0, 0), td::Error);
  EXPECT_THROW(GPTDataset(nullptr, 0, 2, 2, 0), td::Error);
  int64_t out[5];
  EXPECT_THROW(ok.sample(-1, out), td::Error);
}
