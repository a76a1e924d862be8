// The metrics file of the C++ training loop: rows as Python's json.dumps writes them, and a
// resumed run's trimming (keep the rows up to the checkpoint's step) and a supervised attempt's
// appending (Note [Supervised metrics] in src/train/trainer.cpp).
#include "tardelli/train/metrics_file.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace td::train {
namespace {

using MetricsFileTest = test::TempDirTest;

TEST(MetricsRowStep, ReadsRowsWithNonFiniteNumbers) {
  EXPECT_EQ(metrics_row_step(R"({"step": 3, "loss": NaN, "grad_norm": -Infinity})"), 3);
  EXPECT_EQ(metrics_row_step(R"({"note": "NaN \"Infinity\"", "step": 7})"), 7);
  EXPECT_EQ(metrics_row_step(R"({"event": "restart"})"), std::nullopt);
  EXPECT_THROW(metrics_row_step("{\"step\": "), Error);
}

TEST_F(MetricsFileTest, AResumedRunKeepsTheRowsUpToItsStep) {
  const std::string p = path("m.jsonl");
  const std::string rows =
      "{\"step\": 1, \"loss\": 4.5}\n"
      "{\"step\": 2, \"loss\": 4.25, \"grad_norm\": NaN}\n"
      "\n"
      "{\"step\": 3, \"loss\": 4.0}\n"
      "{\"step\": 4, \"loss\": 3.5}\n";
  test::write_bytes(p, rows);
  {
    MetricsFile m(p, 2);
    m.write(json::Object{{"step", 3}, {"loss", 1.5}});
  }
  EXPECT_EQ(test::read_bytes(p),
            "{\"step\": 1, \"loss\": 4.5}\n"
            "{\"step\": 2, \"loss\": 4.25, \"grad_norm\": NaN}\n"
            "{\"step\": 3, \"loss\": 1.5}\n");
  {
    MetricsFile m(p);  // a fresh run truncates
    m.write(json::Object{{"step", 1}, {"loss", 2.0}});
  }
  EXPECT_EQ(test::read_bytes(p), "{\"step\": 1, \"loss\": 2.0}\n");
  {
    MetricsFile m(path("new/m.jsonl"), 5);  // nothing to trim: a new file
    m.write(json::Object{{"step", 6}});
  }
  EXPECT_EQ(test::read_bytes(path("new/m.jsonl")), "{\"step\": 6}\n");
}

TEST_F(MetricsFileTest, ARestartedAttemptKeepsEveryEarlierRow) {
  // Property: in append mode (a supervised restart) the rows of steps after the checkpoint
  // stay, the restart event and the new attempt's rows follow them; a later unsupervised
  // resume trims again by step (the restart event carries its checkpoint's step: kept).
  const std::string p = path("m.jsonl");
  {
    MetricsFile m(p);
    for (int s = 1; s <= 3; ++s) m.write(json::Object{{"step", s}});
  }
  {
    MetricsFile m(p, 2, /*append=*/true);
    m.write(json::Object{{"event", "restart"}, {"attempt", 1}, {"step", 2}});
    m.write(json::Object{{"step", 3}});
    m.write(json::Object{{"step", 4}});
  }
  EXPECT_EQ(test::read_bytes(p),
            "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n"
            "{\"event\": \"restart\", \"attempt\": 1, \"step\": 2}\n"
            "{\"step\": 3}\n{\"step\": 4}\n");
  { MetricsFile m(p, 2); }
  EXPECT_EQ(test::read_bytes(p),
            "{\"step\": 1}\n{\"step\": 2}\n"
            "{\"event\": \"restart\", \"attempt\": 1, \"step\": 2}\n");
}

}  // namespace
}  // namespace td::train
