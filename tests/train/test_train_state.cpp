// Checkpoints of the C++ training loop in one process (no MPI): a save after step 2 resumed by a
// fresh Trainer continues the uninterrupted run bitwise (dropout streams, AdamW moments and
// step, data position), and --resume's refusals. The multi-rank layouts and the crossing with
// python -m tardelli.train are tests/python/test_train_cpp.py's.
#include "tardelli/train/train_state.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tardelli/checkpoint/checkpoint.h"
#include "tardelli/train/trainer.h"
#include "test_util.h"

namespace td::train {
namespace {

TrainConfig small_config(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {"--synthetic-data",
                                   "--vocab-size",
                                   "64",
                                   "--layers",
                                   "2",
                                   "--d-model",
                                   "32",
                                   "--heads",
                                   "4",
                                   "--seq-len",
                                   "16",
                                   "--micro-batch-size",
                                   "2",
                                   "--steps",
                                   "4",
                                   "--warmup-steps",
                                   "1",
                                   "--dropout",
                                   "0.1",
                                   "--lr",
                                   "3e-3",
                                   "--eval-interval",
                                   "0",
                                   "--no-progress"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return parse_config(argv);
}

struct Losses {
  std::vector<double> loss, grad_norm;
};

void steps(Trainer& t, int64_t until, Losses& out) {
  while (t.step() < until) {
    const StepRecord r = t.train_step();
    out.loss.push_back(r.loss);
    out.grad_norm.push_back(r.grad_norm);
  }
}

using TrainStateTest = test::TempDirTest;

TEST_F(TrainStateTest, SaveAndResumeContinueTheRunBitwise) {
  Losses full, resumed;
  {
    Trainer t(small_config());
    steps(t, 4, full);
  }
  const std::string root = path("save");
  {
    Trainer t(small_config({"--save", root}));
    steps(t, 2, resumed);
    EXPECT_EQ(t.save(root), root + "/step_00000002");
  }
  checkpoint::CheckpointReader reader(root + "/step_00000002");
  EXPECT_EQ(reader.meta().at("state_format").as_int(), kStateFormat);
  EXPECT_EQ(reader.meta().at("optimizer").at("step").as_int(), 2);
  EXPECT_EQ(reader.meta().at("data").at("consumed_samples").as_int(), 4);
  EXPECT_EQ(reader.meta().at("train").at("dropout").as_double(), 0.1);
  EXPECT_TRUE(reader.has_file("shards.rank00000.index.json"));
  EXPECT_TRUE(reader.has_file("rng.rank00000.json"));
  reader.verify();

  Trainer t(small_config({"--save", root, "--resume"}));
  ASSERT_TRUE(t.resumed().has_value());
  EXPECT_EQ(t.resumed()->step, 2);
  EXPECT_EQ(t.resumed()->consumed_samples, 4);
  EXPECT_FALSE(t.resumed()->resharded);
  EXPECT_EQ(t.step(), 2);
  steps(t, 4, resumed);
  EXPECT_EQ(resumed.loss, full.loss);  // bitwise
  EXPECT_EQ(resumed.grad_norm, full.grad_norm);
}

TEST_F(TrainStateTest, ResumeRefusesAnotherModelOrOtherData) {
  const std::string root = path("save");
  {
    Trainer t(small_config());
    Losses l;
    steps(t, 1, l);
    t.save(root);
  }
  auto error = [&](const std::vector<std::string>& extra) -> std::string {
    std::vector<std::string> args = {"--save", root, "--resume"};
    args.insert(args.end(), extra.begin(), extra.end());
    try {
      Trainer t(small_config(args));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string dir = root + "/step_00000001";
  EXPECT_EQ(error({"--layers", "3"}),
            "--resume: checkpoint " + dir +
                " was saved from a different model (this run vs the checkpoint):\n"
                "n_layer: 3 vs 2\n");
  EXPECT_EQ(error({"--split", "90,5,5"}), "--resume: checkpoint " + dir +
                                              " was trained with different data settings: "
                                              "split: '90,5,5' vs '98,1,1'");
  EXPECT_EQ(error({}), "");
}

TEST_F(TrainStateTest, ResumePathSaysWhyThereIsNoCheckpoint) {
  auto error = [](const std::string& root) -> std::string {
    try {
      resume_path(root);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string none = path("none");
  EXPECT_EQ(error(none), "--resume: no complete checkpoint under " + none +
                             " (the directory does not exist); drop --resume to start a new run");
  std::filesystem::create_directories(path("empty"));
  EXPECT_NE(error(path("empty")).find("(it is empty)"), std::string::npos);
  std::filesystem::create_directories(path("partial/step_00000003.tmp"));
  EXPECT_NE(error(path("partial"))
                .find("(it holds step_00000003.tmp; a *.tmp directory is a save that never "
                      "completed)"),
            std::string::npos);
}

}  // namespace
}  // namespace td::train
