// train_gpt: pretrain a small GPT on a Megatron-format dataset with the installed library's
// public C++ API only (data loading, the fused GPT, AdamW, a warmup-cosine schedule, gradient
// clipping, fp16 loss scaling, evaluation and a crash-safe checkpoint). It reads top to bottom:
//
//   train_gpt --data PREFIX [--vocab-size V] [--layers 2] [--d-model 128] [--heads 4]
//             [--seq-len 64] [--micro-batch-size 8] [--steps 100] [--lr 1e-3] [--min-lr 1e-4]
//             [--warmup-steps 10] [--weight-decay 0.1] [--clip-grad 1.0] [--split 90,10,0]
//             [--eval-iters 10] [--log-interval 10] [--seed 1234] [--save DIR [--resume]]
//             [--exit-at STEP] [--dtype fp32|bf16|fp16] [--initial-loss-scale S]
//             [--loss-scale-window N] [--inject-nonfinite-grad STEP]
//
// PREFIX.bin/.idx come from `python -m tardelli.data.preprocess`. Without --vocab-size the
// vocabulary is the largest token id + 1. --save DIR writes DIR/step_XXXXXXXX (the layout of
// docs/checkpoints.md, readable by `python -m tardelli.train`) and DIR/latest; --resume continues
// from find_latest(DIR): same model, optimizer state, schedule position and data position, so
// the resumed run takes the same steps as an uninterrupted one. --exit-at STEP stops (evaluates
// and saves) after STEP steps while the schedule still runs to --steps: an interrupted run.
// --dtype bf16/fp16 runs the activations in that dtype over fp32 master weights; fp16 scales the
// loss dynamically (td::optim::DynamicLossScaler: a step with inf/nan gradients is skipped and
// the scale halves), and the scaler's state is part of the checkpoint. --inject-nonfinite-grad
// STEP seeds that step's backward with inf (a test of the skipping).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/checkpoint/training_state.h"
#include "tardelli/data/data_loader.h"
#include "tardelli/data/gpt_dataset.h"
#include "tardelli/data/indexed_dataset.h"
#include "tardelli/tardelli.h"

namespace {

struct Args {
  std::string data, save, split = "90,10,0", dtype = "fp32";
  int64_t vocab_size = 0, layers = 2, d_model = 128, heads = 4, seq_len = 64, micro_batch = 8;
  int64_t steps = 100, warmup_steps = 10, eval_iters = 10, log_interval = 10, exit_at = -1;
  int64_t loss_scale_window = 2000, inject_nonfinite_grad = -1;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip_grad = 1.0;
  double initial_loss_scale = 65536.0;
  uint64_t seed = 1234;
  bool resume = false;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "train_gpt: %s\nusage: train_gpt --data PREFIX [--vocab-size V] [--layers N] "
               "[--d-model D] [--heads H] [--seq-len T] [--micro-batch-size B] [--steps S] "
               "[--lr LR] [--min-lr LR] [--warmup-steps W] [--weight-decay WD] [--clip-grad C] "
               "[--split A,B,C] [--eval-iters N] [--log-interval N] [--seed S] "
               "[--save DIR [--resume]] [--exit-at STEP] [--dtype fp32|bf16|fp16] "
               "[--initial-loss-scale S] [--loss-scale-window N] [--inject-nonfinite-grad STEP]\n",
               problem.c_str());
  std::exit(2);
}

// "--name value" or "--name=value"; every flag is recorded for the checkpoint's "train" entry.
Args parse_args(int argc, char** argv, td::json::Value& flags) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) usage("unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    if (arg == "resume") {
      a.resume = true;
      flags.set("resume", true);
      continue;
    }
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      kv[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) usage("--" + arg + " needs a value");
      kv[arg] = argv[++i];
    }
  }
  auto num = [&](const std::string& name, auto& out) {
    auto it = kv.find(name);
    if (it == kv.end()) return;
    std::istringstream is(it->second);
    is >> out;
    if (!is || !is.eof()) usage("--" + name + ": bad value '" + it->second + "'");
    flags.set(name, it->second);
    kv.erase(it);
  };
  auto str = [&](const std::string& name, std::string& out) {
    auto it = kv.find(name);
    if (it == kv.end()) return;
    out = it->second;
    flags.set(name, out);
    kv.erase(it);
  };
  str("data", a.data);
  str("save", a.save);
  str("split", a.split);
  str("dtype", a.dtype);
  num("initial-loss-scale", a.initial_loss_scale);
  num("loss-scale-window", a.loss_scale_window);
  num("inject-nonfinite-grad", a.inject_nonfinite_grad);
  num("vocab-size", a.vocab_size);
  num("layers", a.layers);
  num("d-model", a.d_model);
  num("heads", a.heads);
  num("seq-len", a.seq_len);
  num("micro-batch-size", a.micro_batch);
  num("steps", a.steps);
  num("warmup-steps", a.warmup_steps);
  num("eval-iters", a.eval_iters);
  num("log-interval", a.log_interval);
  num("lr", a.lr);
  num("min-lr", a.min_lr);
  num("weight-decay", a.weight_decay);
  num("clip-grad", a.clip_grad);
  num("seed", a.seed);
  num("exit-at", a.exit_at);
  if (!kv.empty()) usage("unknown flag --" + kv.begin()->first);
  if (a.data.empty()) usage("--data is required");
  if (a.resume && a.save.empty()) usage("--resume needs --save DIR");
  if (a.steps < 1 || a.micro_batch < 1 || a.log_interval < 1 || a.eval_iters < 0)
    usage("--steps, --micro-batch-size and --log-interval must be >= 1");
  return a;
}

std::vector<double> parse_split(const std::string& s) {
  std::vector<double> r;
  std::istringstream is(s);
  std::string part;
  while (std::getline(is, part, ',')) r.push_back(std::stod(part));
  return r;
}

// The largest token id + 1 (one pass over the dataset: fine for the small sets of an example).
int64_t scan_vocab(const td::data::IndexedDataset& ds) {
  int64_t max_id = 0;
  std::vector<int64_t> buf;
  for (int64_t s = 0; s < ds.num_sequences(); ++s) {
    buf.resize(static_cast<size_t>(ds.sequence_length(s)));
    ds.read(s, 0, static_cast<int64_t>(buf.size()), buf.data());
    for (int64_t t : buf) max_id = std::max(max_id, t);
  }
  return max_id + 1;
}

// Inputs are tokens [0, T), targets [1, T+1) of each row of a [B, T+1] batch.
td::Tensor inputs(const td::Tensor& batch) {
  return batch.slice(1, 0, batch.size(1) - 1).contiguous();
}
td::Tensor targets(const td::Tensor& batch) {
  return batch.slice(1, 1, batch.size(1)).contiguous();
}

}  // namespace

int main(int argc, char** argv) try {
  td::json::Value flags = td::json::Object{};
  const Args args = parse_args(argc, argv, flags);

  // ---- data: the train and valid document ranges of one indexed dataset ----
  auto indexed = std::make_shared<const td::data::IndexedDataset>(args.data);
  const auto split = td::data::split_documents(indexed->num_documents(), parse_split(args.split));
  auto train_set = std::make_shared<const td::data::GPTDataset>(
      indexed, split[0].begin, split[0].end, args.seq_len, args.seed);
  const int64_t vocab = args.vocab_size > 0 ? args.vocab_size : scan_vocab(*indexed);
  std::printf(
      "data: %s: %lld documents, %lld tokens; train documents [%lld, %lld): %lld samples "
      "of %lld tokens per epoch; vocab %lld\n",
      args.data.c_str(), (long long)indexed->num_documents(), (long long)indexed->num_tokens(),
      (long long)split[0].begin, (long long)split[0].end, (long long)train_set->samples_per_epoch(),
      (long long)args.seq_len, (long long)vocab);

  // ---- model, optimizer, schedule ----
  td::models::GPTConfig config;
  config.arch = td::models::Arch::GPT2;
  config.vocab_size = vocab;
  config.block_size = args.seq_len;
  config.n_layer = args.layers;
  config.n_head = args.heads;
  config.d_model = args.d_model;
  config.seed = args.seed;
  config.dtype = td::checkpoint::parse_short_dtype(args.dtype);
  auto model = std::make_shared<td::models::GPT>(config);

  std::vector<td::optim::ParamGroup> groups;  // decay: matrices and embeddings; no decay: rest
  for (const auto& g : model->param_groups(args.weight_decay)) {
    td::TensorList params;
    for (const auto& [name, p] : g.params) params.push_back(p);
    groups.emplace_back(params, std::nullopt, g.weight_decay);
  }
  td::optim::AdamWOptions adamw;
  adamw.lr = args.lr;
  adamw.beta2 = 0.95;
  td::optim::AdamW optimizer(std::move(groups), adamw);
  td::optim::LRScheduleConfig schedule;
  schedule.max_lr = args.lr;
  schedule.min_lr = args.min_lr;
  schedule.warmup_steps = args.warmup_steps;
  schedule.decay_steps = args.steps;
  td::optim::LRScheduler scheduler(optimizer, schedule);
  // fp16: the loss is scaled before backward (no-op factor 1 for fp32/bf16, whose exponent range
  // needs none).
  const bool fp16 = config.dtype == td::DType::Float16;
  td::optim::DynamicLossScaler scaler(
      {.init_scale = args.initial_loss_scale, .growth_interval = args.loss_scale_window});
  std::printf("model: gpt2, %lld layers, d_model %lld, %lld heads: %lld parameters, %s\n",
              (long long)args.layers, (long long)args.d_model, (long long)args.heads,
              (long long)model->num_parameters(), args.dtype.c_str());

  // ---- resume: parameters, optimizer, schedule, data position, dropout stream ----
  int64_t step = 0, consumed = 0;
  if (args.resume) {
    if (auto path = td::checkpoint::find_latest(args.save)) {
      td::checkpoint::CheckpointReader reader(*path);
      const auto state = td::checkpoint::load_training_state(reader, *model, optimizer, scheduler);
      step = state.step;
      consumed = state.meta.at("data").at("consumed_samples").as_int();
      if (const auto* rng = state.meta.find("rng"); rng && rng->find("dropout"))
        td::checkpoint::generator_from_json(rng->at("dropout"), model->dropout_generator());
      if (const auto* ls = state.meta.find("loss_scaler"); ls && fp16) {
        scaler.load_state({ls->at("scale").as_double(), ls->at("growth_tracker").as_int(),
                           ls->at("skipped_steps").as_int()});
      }
      std::printf("resumed from %s: step %lld, %lld samples consumed\n", reader.path().c_str(),
                  (long long)step, (long long)consumed);
    } else {
      std::printf("no checkpoint in %s: starting from scratch\n", args.save.c_str());
    }
  }

  // ---- train ----
  td::data::DataLoader loader(train_set, args.micro_batch, /*dp_rank=*/0, /*dp_size=*/1, consumed);
  const td::TensorList params = model->parameters();
  auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_since_log = 0;
  model->train();
  const int64_t last = args.exit_at >= 0 ? std::min(args.exit_at, args.steps) : args.steps;
  for (; step < last; ++step) {
    const td::Tensor batch = loader.next();
    const double lr = scheduler.lr();  // the rate this step uses
    optimizer.zero_grad();
    td::Tensor loss = model->forward(inputs(batch), targets(batch));
    double grad_norm = 0;
    bool skipped = false;
    const double loss_scale = fp16 ? scaler.scale() : 1.0;
    if (!fp16 && step + 1 != args.inject_nonfinite_grad) {
      loss.backward();
      grad_norm = td::optim::clip_grad_norm_(params, args.clip_grad);
      optimizer.step();
    } else {
      const double seed = step + 1 == args.inject_nonfinite_grad ? INFINITY : loss_scale;
      td::mul(loss, seed).backward();
      // The norm of the scaled gradients decides the overflow (Note [Overflow from the norm]);
      // one multiply then unscales and clips.
      const double scaled_norm = td::optim::grad_norm(params);
      skipped = fp16 ? !scaler.update(!std::isfinite(scaled_norm)) : false;
      grad_norm = scaled_norm / loss_scale;
      if (!skipped) {
        const double factor =
            td::optim::unscale_clip_factor(scaled_norm, loss_scale, args.clip_grad);
        td::autograd::NoGradGuard no_grad;
        for (td::Tensor p : params) {
          if (td::Tensor g = p.grad(); g.defined()) td::mul_(g, factor);
        }
        optimizer.step();
      }
    }
    scheduler.step();
    tokens_since_log += args.micro_batch * args.seq_len;
    if ((step + 1) % args.log_interval == 0 || step + 1 == last) {
      const auto t1 = std::chrono::steady_clock::now();
      const double secs = std::chrono::duration<double>(t1 - t0).count();
      std::printf("step %5lld | loss %.6f | lr %.3e | grad norm %.3f", (long long)(step + 1),
                  loss.item<float>(), lr, grad_norm);
      if (fp16) std::printf(" | loss scale %g%s", loss_scale, skipped ? " (skipped)" : "");
      std::printf(" | %.0f tokens/s\n", tokens_since_log / secs);
      std::fflush(stdout);
      t0 = t1;
      tokens_since_log = 0;
    }
  }

  // ---- evaluate on the valid documents ----
  if (split[1].size() > 0 && args.eval_iters > 0) {
    auto valid_set = std::make_shared<const td::data::GPTDataset>(
        indexed, split[1].begin, split[1].end, args.seq_len, args.seed);
    td::data::DataLoader valid(valid_set, args.micro_batch);
    td::autograd::NoGradGuard no_grad;
    model->eval();
    double total = 0;
    for (int64_t i = 0; i < args.eval_iters; ++i) {
      const td::Tensor batch = valid.next();
      total += model->forward(inputs(batch), targets(batch)).item<float>();
    }
    model->train();
    const double mean = total / static_cast<double>(args.eval_iters);
    std::printf("valid loss %.4f | perplexity %.2f (%lld batches)\n", mean, std::exp(mean),
                (long long)args.eval_iters);
  }

  // ---- save ----
  if (!args.save.empty()) {
    const std::string name = td::checkpoint::step_dir_name(step);
    td::json::Value data = td::json::Object{};
    data.set("consumed_samples", loader.consumed_samples());
    data.set("seed", static_cast<int64_t>(args.seed));
    data.set("prefix", args.data);
    td::json::Value rng = td::json::Object{};
    rng.set("dropout", td::checkpoint::generator_to_json(model->dropout_generator()));
    td::json::Value extra = td::json::Object{};
    extra.set("data", data);
    extra.set("rng", rng);
    extra.set("train", flags);
    if (fp16) {
      td::json::Value ls = td::json::Object{};
      ls.set("scale", scaler.state().scale);
      ls.set("growth_tracker", scaler.state().growth_tracker);
      ls.set("skipped_steps", scaler.state().skipped_steps);
      extra.set("loss_scaler", ls);
    }
    td::checkpoint::CheckpointWriter writer(args.save + "/" + name);
    // The tokenizer preprocess wrote next to the data travels with the model, so
    // `python -m tardelli.generate --checkpoint DIR` can decode its samples.
    for (const char* file : {"vocab.json", "merges.txt"}) {
      const std::string src = args.data + ".tokenizer/" + file;
      if (std::FILE* f = std::fopen(src.c_str(), "rb")) {
        std::fclose(f);
        writer.copy_file(file, src);
      }
    }
    const std::string dir =
        td::checkpoint::save_training_state(writer, *model, optimizer, scheduler, extra);
    td::checkpoint::update_latest(args.save, name);
    std::printf("saved %s\n", dir.c_str());
  }
  return 0;
} catch (const td::Error& e) {
  std::fprintf(stderr, "train_gpt: %s\n", e.what());
  return 1;
}
