#include "tardelli/train/train_data.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tardelli/core/error.h"
#include "tardelli/core/json.h"
#include "tardelli/core/rng.h"
#include "tardelli/data/indexed_dataset.h"
#include "tardelli/ops/factory.h"
#include "tardelli/ops/join.h"
#include "tardelli/parallel/context_parallel.h"

namespace td::train {

namespace fs = std::filesystem;

namespace {

MicroBatch cut(const Tensor& rows) {
  const int64_t n = rows.size(1) - 1;
  return {rows.narrow(1, 0, n).contiguous(), rows.narrow(1, 1, n).contiguous()};
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TD_CHECK(f.good(), "train data: cannot read ", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

SyntheticBatches::SyntheticBatches(int64_t vocab_size, int64_t seq_len, uint64_t seed,
                                   int64_t micro_batch, int64_t dp_rank, int64_t dp_size,
                                   int64_t consumed_samples)
    : vocab_size_(vocab_size),
      seq_len_(seq_len),
      seed_(seed),
      micro_batch_(micro_batch),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      consumed_(consumed_samples) {
  TD_CHECK(vocab_size > 0 && seq_len > 0 && micro_batch > 0 && dp_size > 0 && dp_rank >= 0 &&
               dp_rank < dp_size && consumed_samples >= 0,
           "SyntheticBatches: invalid vocab_size ", vocab_size, ", seq_len ", seq_len,
           ", micro_batch ", micro_batch, ", dp rank ", dp_rank, " of ", dp_size,
           " or consumed_samples ", consumed_samples);
}

Tensor SyntheticBatches::sample(int64_t i) const {
  Generator g(seed_ ^ 0x5EED5EEDULL, static_cast<uint64_t>(i));
  return randint(0, vocab_size_, {seq_len_ + 1}, {DType::Int64, kCPU, false}, &g);
}

MicroBatch SyntheticBatches::next() {
  const int64_t first = consumed_ + dp_rank_ * micro_batch_;
  TensorList rows;
  rows.reserve(static_cast<size_t>(micro_batch_));
  for (int64_t j = 0; j < micro_batch_; ++j) rows.push_back(sample(first + j));
  consumed_ += micro_batch_ * dp_size_;
  return cut(stack(rows, 0));
}

DatasetBatches::DatasetBatches(std::shared_ptr<const data::GPTDataset> dataset, int64_t micro_batch,
                               int64_t dp_rank, int64_t dp_size, int64_t consumed_samples)
    : loader_(std::move(dataset), micro_batch, dp_rank, dp_size, consumed_samples) {}

ContextParallelBatches::ContextParallelBatches(std::unique_ptr<BatchSource> source, int cp_rank,
                                               int cp_size)
    : source_(std::move(source)), rank_(cp_rank), size_(cp_size) {
  TD_CHECK(source_ != nullptr && cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size,
           "ContextParallelBatches: bad source or cp rank ", cp_rank, " of ", cp_size);
}

MicroBatch ContextParallelBatches::next() {
  const MicroBatch b = source_->next();
  if (size_ == 1) return b;
  return {parallel::zigzag_slice(b.input, 1, rank_, size_),
          parallel::zigzag_slice(b.target, 1, rank_, size_)};
}

MicroBatch DatasetBatches::next() {
  return cut(loader_.next());
}

int64_t tokenizer_vocab_size(const std::string& dir) {
  // The tokenizer library counts the model's vocabulary plus the added (special) tokens it does
  // not already hold (Tokenizer.vocab_size in python/tardelli/data/tokenizer.py).
  const std::string vocab_path = (fs::path(dir) / "vocab.json").string();
  json::Value vocab;
  try {
    vocab = json::parse(read_file(vocab_path));
  } catch (const Error& e) {
    TD_ERROR("train data: the tokenizer vocabulary ", vocab_path, " is unreadable: ", e.what());
  }
  TD_CHECK(vocab.is_object(), "train data: ", vocab_path, " is not a JSON object of tokens");
  std::set<std::string> tokens;
  for (const auto& [k, v] : vocab.as_object()) tokens.insert(k);
  std::vector<std::string> specials = {"<|endoftext|>"};
  const std::string sp_path = (fs::path(dir) / "special_tokens.json").string();
  if (fs::exists(sp_path)) {
    const json::Value sp = json::parse(read_file(sp_path));
    TD_CHECK(sp.is_array(), "train data: ", sp_path, " is not a JSON list of tokens");
    specials.clear();
    for (const json::Value& s : sp.as_array()) specials.push_back(s.as_string());
  }
  for (const std::string& s : specials) tokens.insert(s);
  return static_cast<int64_t>(tokens.size());
}

TrainData::TrainData(DataOptions options) : o_(std::move(options)) {
  if (o_.synthetic) {
    TD_CHECK(o_.vocab_size > 0, "train data: synthetic data needs a vocabulary size");
    vocab_size_ = o_.vocab_size;
    return;
  }
  const std::string tok = o_.prefix + ".tokenizer";
  if (fs::is_directory(tok)) tokenizer_dir_ = tok;
  if (o_.vocab_size > 0) {
    vocab_size_ = o_.vocab_size;
  } else {
    TD_CHECK(!tokenizer_dir_.empty(), "--data ", o_.prefix, ": no tokenizer at ", tok,
             "; give --vocab-size");
    vocab_size_ = tokenizer_vocab_size(tokenizer_dir_);
  }
  auto ds = std::make_shared<const data::IndexedDataset>(o_.prefix);
  const auto ranges = data::split_documents(ds->num_documents(),
                                            std::vector<double>(o_.split.begin(), o_.split.end()));
  auto make = [&](const data::DocumentRange& r) -> std::shared_ptr<const data::GPTDataset> {
    if (r.end <= r.begin) return nullptr;
    return std::make_shared<const data::GPTDataset>(ds, r.begin, r.end, o_.seq_len, o_.seed);
  };
  train_ = make(ranges[0]);
  valid_ = make(ranges[1]);
  TD_CHECK(train_ != nullptr, "--data ", o_.prefix, ": the training split is empty");
}

std::unique_ptr<BatchSource> TrainData::train_loader(int64_t consumed_samples) const {
  std::unique_ptr<BatchSource> out;
  if (o_.synthetic) {
    out = std::make_unique<SyntheticBatches>(vocab_size_, o_.seq_len, o_.seed, o_.micro_batch,
                                             o_.dp_rank, o_.dp_size, consumed_samples);
  } else {
    out = std::make_unique<DatasetBatches>(train_, o_.micro_batch, o_.dp_rank, o_.dp_size,
                                           consumed_samples);
  }
  return on_cp(std::move(out));
}

std::unique_ptr<BatchSource> TrainData::valid_loader() const {
  if (o_.synthetic) {
    return on_cp(std::make_unique<SyntheticBatches>(vocab_size_, o_.seq_len, o_.seed + 1,
                                                    o_.micro_batch, o_.dp_rank, o_.dp_size, 0));
  }
  if (valid_ == nullptr) return nullptr;
  return on_cp(std::make_unique<DatasetBatches>(valid_, o_.micro_batch, o_.dp_rank, o_.dp_size, 0));
}

std::unique_ptr<BatchSource> TrainData::on_cp(std::unique_ptr<BatchSource> source) const {
  if (o_.cp_size == 1) return source;
  return std::make_unique<ContextParallelBatches>(std::move(source), o_.cp_rank, o_.cp_size);
}

}  // namespace td::train
