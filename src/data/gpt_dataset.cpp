// GPT samples over a document range: split rule, shuffled epochs, sample lookup.
#include "tardelli/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "tardelli/core/error.h"
#include "tardelli/core/rng.h"

namespace td::data {

std::array<DocumentRange, 3> split_documents(int64_t num_documents, std::vector<double> ratios) {
  TD_CHECK(num_documents >= 0, "split_documents: num_documents must be >= 0, got ", num_documents);
  TD_CHECK(!ratios.empty() && ratios.size() <= 3,
           "split_documents: expected 1 to 3 ratios (train, valid, test), got ", ratios.size());
  ratios.resize(3, 0.0);
  double sum = 0;
  for (double r : ratios) {
    TD_CHECK(std::isfinite(r) && r >= 0, "split_documents: ratios must be finite and >= 0, got ",
             r);
    sum += r;
  }
  TD_CHECK(sum > 0, "split_documents: the ratios sum to 0");
  // Python's round() is round-half-to-even, like nearbyint in the default rounding mode.
  std::array<int64_t, 4> b{0, 0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    b[k + 1] = b[k] + static_cast<int64_t>(
                          std::nearbyint(ratios[k] / sum * static_cast<double>(num_documents)));
  }
  const int64_t diff = b[3] - num_documents;
  for (int k = 1; k < 4; ++k) b[k] = std::clamp(b[k] - diff, b[k - 1], num_documents);
  std::array<DocumentRange, 3> r;
  for (int k = 0; k < 3; ++k) r[k] = {b[k], b[k + 1]};
  return r;
}

namespace {

// Note [Portable shuffles]: std::shuffle and std::uniform_int_distribution are specified only
// up to their statistics, so libstdc++ and libc++ shuffle differently and a dataset order would
// change with the toolchain. This stream is Philox4x32-10 keyed by the seed with the counter
// (block index, epoch, purpose), and bounded draws use Lemire's unbiased multiply-and-reject.
class ShuffleStream {
 public:
  ShuffleStream(uint64_t seed, uint64_t epoch, uint32_t purpose)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        epoch_(static_cast<uint32_t>(epoch)),
        purpose_(purpose) {}

  uint64_t next64() {
    if (lane_ == 2) {
      const std::array<uint32_t, 4> c{static_cast<uint32_t>(block_),
                                      static_cast<uint32_t>(block_ >> 32), epoch_, purpose_};
      buf_ = philox4x32(c, key_);
      ++block_;
      lane_ = 0;
    }
    const uint64_t v = (static_cast<uint64_t>(buf_[2 * lane_]) << 32) | buf_[2 * lane_ + 1];
    ++lane_;
    return v;
  }

  // Uniform in [0, bound), bound >= 1.
  uint64_t below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next64()) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next64()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t epoch_, purpose_;
  uint64_t block_ = 0;
  std::array<uint32_t, 4> buf_{};
  int lane_ = 2;
};

constexpr uint32_t kDocumentShuffle = 0x646f6373;  // "docs"
constexpr uint32_t kSampleShuffle = 0x736d706c;    // "smpl"

void fisher_yates(std::vector<int64_t>& a, ShuffleStream& rng) {
  for (size_t i = a.size(); i > 1; --i) {
    const auto j = static_cast<size_t>(rng.below(i));
    std::swap(a[i - 1], a[j]);
  }
}

}  // namespace

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> dataset, int64_t doc_begin,
                       int64_t doc_end, int64_t seq_len, uint64_t seed)
    : dataset_(std::move(dataset)),
      doc_begin_(doc_begin),
      doc_end_(doc_end),
      seq_len_(seq_len),
      seed_(seed) {
  TD_CHECK(dataset_ != nullptr, "GPTDataset: the indexed dataset is null");
  const int64_t nd = dataset_->num_documents();
  TD_CHECK(0 <= doc_begin && doc_begin < doc_end && doc_end <= nd, "GPTDataset: document range [",
           doc_begin, ", ", doc_end, ") is empty or outside [0, ", nd, ") of ", dataset_->prefix());
  TD_CHECK(seq_len >= 1, "GPTDataset: seq_len must be >= 1, got ", seq_len);
  TD_CHECK(is_integer_dtype_code(dataset_->token_dtype_code()), "GPTDataset: ", dataset_->prefix(),
           " holds ", dtype_code_name(dataset_->token_dtype_code()), " values, not integer tokens");
  doc_len_.resize(static_cast<size_t>(doc_end - doc_begin));
  for (int64_t d = doc_begin; d < doc_end; ++d) {
    doc_len_[d - doc_begin] = dataset_->document_length(d);
    num_tokens_ += doc_len_[d - doc_begin];
  }
  samples_per_epoch_ = num_tokens_ > 0 ? (num_tokens_ - 1) / seq_len : 0;
  TD_CHECK(samples_per_epoch_ >= 1, "GPTDataset: documents [", doc_begin, ", ", doc_end, ") of ",
           dataset_->prefix(), " hold ", num_tokens_, " tokens, too few for one sample of seq_len ",
           seq_len, " (which needs seq_len + 1 = ", seq_len + 1, " tokens)");
}

std::shared_ptr<const GPTDataset::Epoch> GPTDataset::build_epoch(int64_t e) const {
  TD_CHECK(e >= 0 && e <= std::numeric_limits<uint32_t>::max(), "GPTDataset: epoch ", e,
           " out of range");
  auto ep = std::make_shared<Epoch>();
  ep->index = e;
  const auto nd = static_cast<int64_t>(doc_len_.size());
  ep->docs.resize(static_cast<size_t>(nd));
  for (int64_t k = 0; k < nd; ++k) ep->docs[k] = doc_begin_ + k;
  ShuffleStream doc_rng(seed_, static_cast<uint64_t>(e), kDocumentShuffle);
  fisher_yates(ep->docs, doc_rng);
  ep->doc_start.resize(static_cast<size_t>(nd) + 1);
  int64_t pos = 0;
  for (int64_t k = 0; k < nd; ++k) {
    ep->doc_start[k] = pos;
    pos += doc_len_[ep->docs[k] - doc_begin_];
  }
  ep->doc_start[nd] = pos;
  ep->chunks.resize(static_cast<size_t>(samples_per_epoch_));
  for (int64_t j = 0; j < samples_per_epoch_; ++j) ep->chunks[j] = j;
  ShuffleStream sample_rng(seed_, static_cast<uint64_t>(e), kSampleShuffle);
  fisher_yates(ep->chunks, sample_rng);
  return ep;
}

std::shared_ptr<const GPTDataset::Epoch> GPTDataset::epoch(int64_t e) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < cache_.size(); ++k) {
    if (cache_[k]->index == e) {
      auto hit = cache_[k];
      if (k != 0) std::rotate(cache_.begin(), cache_.begin() + k, cache_.begin() + k + 1);
      return hit;
    }
  }
  auto ep = build_epoch(e);
  cache_.insert(cache_.begin(), ep);
  if (cache_.size() > 2) cache_.pop_back();
  return ep;
}

void GPTDataset::sample(int64_t i, int64_t* out) const {
  TD_CHECK(i >= 0, "GPTDataset::sample: index must be >= 0, got ", i);
  const auto ep = epoch(i / samples_per_epoch_);
  int64_t pos = ep->chunks[i % samples_per_epoch_] * seq_len_;
  int64_t need = seq_len_ + 1;
  // The stream slot holding `pos` (the last slot starting at or before it; empty documents
  // share their start with the next one and are skipped by upper_bound).
  auto slot =
      static_cast<size_t>(std::upper_bound(ep->doc_start.begin(), ep->doc_start.end(), pos) -
                          ep->doc_start.begin() - 1);
  while (need > 0) {
    const int64_t doc = ep->docs[slot];
    int64_t off = pos - ep->doc_start[slot];  // within the document
    for (int64_t s = dataset_->document_first(doc), se = dataset_->document_end(doc);
         s < se && need > 0; ++s) {
      const int64_t len = dataset_->sequence_length(s);
      if (off >= len) {
        off -= len;
        continue;
      }
      const int64_t n = std::min(len - off, need);
      dataset_->read(s, off, n, out);
      out += n;
      need -= n;
      pos += n;
      off = 0;
    }
    ++slot;
  }
}

Tensor GPTDataset::sample(int64_t i) const {
  Tensor t = Tensor::empty({seq_len_ + 1}, DType::Int64);
  sample(i, t.data_ptr<int64_t>());
  return t;
}

std::vector<int64_t> GPTDataset::document_order(int64_t e) const {
  return epoch(e)->docs;
}
std::vector<int64_t> GPTDataset::sample_order(int64_t e) const {
  return epoch(e)->chunks;
}

}  // namespace td::data
