// The Trainer's checkpoint hooks (include/tardelli/train/trainer.h): --resume, --save,
// --save-interval, --exit-interval and --async-save as docs/checkpoints.md describes
// them, through train_state.h.
#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/train/supervision.h"
#include "tardelli/train/trainer.h"

#include "train_util.h"

namespace td::train {

using detail::perf_s;

TrainState Trainer::state_view() const {
  TrainState s;
  s.cfg = &cfg_;
  s.model_config = mcfg_;
  s.chunks = chunks_;
  s.world = world_;
  s.grid = grid_.get();
  s.adamw = adamw_.get();
  s.zero = zero_opt_.get();
  s.expert_zero = expert_opt_.get();
  s.fsdp = fsdp_.get();
  s.compressors = compressors_;
  s.scaler = scaler_.get();
  s.precision = precision_.get();
  s.tokenizer_dir = checkpoint_only_ ? checkpoint_only_->tokenizer_dir : data_->tokenizer_dir();
  return s;
}

int64_t Trainer::restore() {
  attempt_ = supervised_attempt();
  if (attempt_ && !(cfg_.resume && !cfg_.save.empty())) {
    throw ConfigError(
        "under python -m tardelli.launch --max-restarts the job restarts from its latest "
        "checkpoint: give --save DIR --resume");
  }
  if (!cfg_.resume) return 0;
  if (attempt_ && !checkpoint::find_latest(cfg_.save)) {
    // A supervised job's first attempt starts the run its later attempts resume (unsupervised,
    // nothing to resume is an error: resume_path says why).
    fresh_start_note_ = "train: --resume: no checkpoint under " + cfg_.save +
                        " yet (supervised attempt " + std::to_string(*attempt_) +
                        "); starting from scratch";
    return 0;
  }
  return load_checkpoint(resume_path(cfg_.save)).consumed_samples;
}

const LoadedState& Trainer::load_checkpoint(const std::string& path) {
  LoadedState st = load_state(state_view(), path);
  if (st.error_feedback_reset) {
    fresh_start_note_ =
        "train: --resume at another layout: the gradient compressors' error feedback starts at "
        "zero";
  }
  step_ = st.step;
  if (scaler_ != nullptr && st.loss_scaler) scaler_->load_state(*st.loss_scaler);
  if (st.nonfinite) set_nonfinite_skips(st.nonfinite->skips, st.nonfinite->consecutive);
  // In the constructor the loader is made from the position restore() returns.
  if (loader_ != nullptr) loader_ = data_->train_loader(st.consumed_samples);
  resumed_ = std::move(st);
  return *resumed_;
}

std::string Trainer::resumed_line() const {
  return "train: resumed from " + resumed_->path + " at step " + std::to_string(resumed_->step) +
         " (" + std::to_string(resumed_->consumed_samples) + " samples consumed" +
         (resumed_->resharded ? "; resharded from another layout" : "") + ")";
}

std::string Trainer::save(const std::string& root) {
  return save_state(state_view(), root, step_, loader_->consumed_samples(), nonfinite_counters());
}

std::optional<NonfiniteCounters> Trainer::nonfinite_counters() const {
  if (cfg_.on_nonfinite != "skip") return std::nullopt;
  return NonfiniteCounters{skips_, consecutive_};
}

void Trainer::save_if_due(StepRecord& rec, bool exiting, bool give_up,
                          const std::function<void(const std::string&)>& say) {
  const TrainConfig& c = cfg_;
  if (saver_ != nullptr) {
    if (auto path = saver_->poll()) say("train: saved " + *path + " (in the background)");
  }
  const bool due =
      step_ == c.steps || exiting || (c.save_interval > 0 && step_ % c.save_interval == 0);
  // A step that gives up after too many non-finite steps saves nothing.
  if (c.save.empty() || !due || give_up) return;
  const double t0 = perf_s();
  std::string note;
  if (c.async_save) {
    if (saver_ == nullptr) saver_ = std::make_unique<AsyncSaver>(world_);
    if (auto path = saver_->wait()) say("train: saved " + *path + " (in the background)");
    const std::string path = saver_->save(state_view(), c.save, step_, loader_->consumed_samples(),
                                          nonfinite_counters());
    note = "train: saving " + path + " in the background";
  } else {
    note = "train: saved " + save(c.save);
  }
  rec.save_blocked_s = perf_s() - t0;
  say(note);
}

void Trainer::finish_saves(const std::function<void(const std::string&)>& say) {
  if (saver_ == nullptr) return;
  if (auto path = saver_->wait()) say("train: saved " + *path + " (in the background)");
}

}  // namespace td::train
