// Pipeline schedules as data: generation, validation, simulation and the Chrome trace.
#include "tardelli/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tardelli/core/error.h"
#include "tardelli/core/json.h"

namespace {

using td::parallel::Action;
using td::parallel::ActionKind;
using td::parallel::bubble_formula;
using td::parallel::make_schedule;
using td::parallel::PipelineSchedule;
using td::parallel::ScheduleKind;
using td::parallel::simulate;
using td::parallel::validate;

constexpr ScheduleKind kGPipe = ScheduleKind::GPipe;
constexpr ScheduleKind k1F1B = ScheduleKind::OneFOneB;
constexpr ScheduleKind kInterleaved = ScheduleKind::Interleaved;
constexpr ScheduleKind kZB = ScheduleKind::ZeroBubbleH1;

// The text of the td::Error f() throws ("" if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const td::Error& e) {
    return e.what();
  }
  return "";
}

std::string names(const std::vector<Action>& list) {
  std::string s;
  for (const auto& a : list) {
    if (!s.empty()) s += ' ';
    s += td::parallel::to_string(a);
  }
  return s;
}

// Calls f(kind, p, m, v) for every schedule the generator accepts with p in 1..8, m in 1..24 and
// v in 2..4 for interleaved.
template <typename F>
void for_all_schedules(F&& f) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 24; ++m) {
      for (ScheduleKind k : {kGPipe, k1F1B, kZB}) f(k, p, m, 1);
      if (m % p != 0) continue;
      for (int v = 2; v <= 4; ++v) f(kInterleaved, p, m, v);
    }
  }
}

// Property: every generated schedule is valid (complete, ordered, deadlock-free) and every rank
// runs each (micro-batch, chunk) exactly once per pass kind: 2*m*v actions, or 3*m for ZB-H1.
TEST(PipelineSchedule, AllSchedulesValidateAndCount) {
  int checked = 0;
  for_all_schedules([&](ScheduleKind k, int p, int m, int v) {
    SCOPED_TRACE(testing::Message() << to_string(k) << " p=" << p << " m=" << m << " v=" << v);
    const PipelineSchedule s = make_schedule(k, p, m, v);
    ASSERT_NO_THROW(validate(s));
    ASSERT_EQ(s.actions.size(), static_cast<size_t>(p));
    for (const auto& list : s.actions) {
      std::map<ActionKind, int> count;
      for (const auto& a : list) count[a.kind]++;
      EXPECT_EQ(count[ActionKind::Forward], m * v);
      if (k == kZB) {
        EXPECT_EQ(count[ActionKind::BackwardInput], m);
        EXPECT_EQ(count[ActionKind::BackwardWeight], m);
        EXPECT_EQ(count[ActionKind::Backward], 0);
      } else {
        EXPECT_EQ(count[ActionKind::Backward], m * v);
        EXPECT_EQ(list.size(), static_cast<size_t>(2 * m * v));
      }
    }
    ++checked;
  });
  EXPECT_GT(checked, 8 * 24 * 3);
}

// Property: the generators reproduce the reference orders (Megatron's 1F1B warm-up of p-r-1,
// Megatron's interleaved grouping of p micro-batches per chunk with warm-up
// (p-r-1)*2 + (v-1)*p, and ZB-H1 holding rank r's weight passes r behind its input passes).
TEST(PipelineSchedule, ReferenceOrders) {
  const auto g = make_schedule(kGPipe, 2, 3);
  EXPECT_EQ(names(g.actions[1]), "F0c0 F1c0 F2c0 B0c0 B1c0 B2c0");
  const auto s = make_schedule(k1F1B, 4, 6);
  EXPECT_EQ(names(s.actions[0]), "F0c0 F1c0 F2c0 F3c0 B0c0 F4c0 B1c0 F5c0 B2c0 B3c0 B4c0 B5c0");
  EXPECT_EQ(names(s.actions[2]), "F0c0 F1c0 B0c0 F2c0 B1c0 F3c0 B2c0 F4c0 B3c0 F5c0 B4c0 B5c0");
  EXPECT_EQ(names(s.actions[3]), "F0c0 B0c0 F1c0 B1c0 F2c0 B2c0 F3c0 B3c0 F4c0 B4c0 F5c0 B5c0");
  const auto i = make_schedule(kInterleaved, 2, 4, 2);
  EXPECT_EQ(names(i.actions[0]),
            "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0");
  EXPECT_EQ(names(i.actions[1]),
            "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0");
  const auto z = make_schedule(kZB, 4, 6);
  EXPECT_EQ(names(z.actions[0]),
            "F0c0 F1c0 F2c0 F3c0 I0c0 W0c0 F4c0 I1c0 W1c0 F5c0 I2c0 W2c0 I3c0 W3c0 I4c0 W4c0 "
            "I5c0 W5c0");
  EXPECT_EQ(names(z.actions[3]),
            "F0c0 I0c0 F1c0 I1c0 F2c0 I2c0 F3c0 I3c0 W0c0 F4c0 I4c0 W1c0 F5c0 I5c0 W2c0 W3c0 "
            "W4c0 W5c0");
}

// Property: with F = 1 and a full backward of 2, GPipe and 1F1B take exactly (m+p-1)*3 time
// units, so the bubble is exactly (p-1)/(m+p-1) (all times are small integers: exact in double).
// A full backward costs t_backward_input + t_backward_weight, so (1, 1, 1) and (1, 2, 0) agree.
TEST(PipelineSchedule, GPipeAnd1F1BBubbleIsTheFormula) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 24; ++m) {
      for (ScheduleKind k : {kGPipe, k1F1B}) {
        SCOPED_TRACE(testing::Message() << to_string(k) << " p=" << p << " m=" << m);
        const auto s = make_schedule(k, p, m);
        const auto r = simulate(s, 1, 1, 1);
        EXPECT_EQ(r.makespan, 3.0 * (m + p - 1));
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (m + p - 1), 1e-12);
        EXPECT_NEAR(r.bubble_fraction, bubble_formula(k, p, m, 1), 1e-12);
        EXPECT_EQ(simulate(s, 1, 2, 0).makespan, r.makespan);
        for (double b : r.busy) EXPECT_EQ(b, 3.0 * m);
      }
    }
  }
}

// Property: 1F1B keeps at most min(p-r, m) micro-batches in flight on rank r (p on the first
// stage when m >= p); GPipe keeps all m; ZB-H1 keeps exactly 1F1B's peak.
TEST(PipelineSchedule, PeakInFlight) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 24; ++m) {
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      const auto one = simulate(make_schedule(k1F1B, p, m));
      const auto gp = simulate(make_schedule(kGPipe, p, m));
      const auto zb = simulate(make_schedule(kZB, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(one.peak_in_flight[r], std::min(p - r, m)) << "rank " << r;
        EXPECT_EQ(gp.peak_in_flight[r], m) << "rank " << r;
        EXPECT_EQ(zb.peak_in_flight[r], one.peak_in_flight[r]) << "rank " << r;
      }
    }
  }
}

// Property (ZB-H1, F = BI = BW = 1): never worse than 1F1B; for m >= p every rank idles exactly
// p-1 units (1F1B: 3(p-1)), so the makespan is 3m + p-1 and the bubble is the formula
// (p-1)/(3m+p-1). Its ratio to 1F1B's bubble is (m+p-1)/(3m+p-1) = 1/3 + (2/3)(p-1)/(3m+p-1),
// which for m >= 8p is within 2/(3*25) < 0.03 of a third: we assert 0.03.
TEST(PipelineSchedule, ZeroBubbleCutsTheBubbleToAThird) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 24 * 8; m += (m < 24 ? 1 : 8)) {
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      const auto zb = simulate(make_schedule(kZB, p, m));
      const auto one = simulate(make_schedule(k1F1B, p, m));
      EXPECT_LE(zb.bubble_fraction, one.bubble_fraction + 1e-12);
      EXPECT_LE(zb.makespan, one.makespan);
      if (m < p) continue;
      EXPECT_EQ(zb.makespan, 3.0 * m + p - 1);
      EXPECT_NEAR(zb.bubble_fraction, bubble_formula(kZB, p, m), 1e-12);
      if (p > 1 && m >= 8 * p) {
        EXPECT_NEAR(zb.bubble_fraction / one.bubble_fraction, 1.0 / 3.0, 0.03);
      }
    }
  }
}

// Property: interleaving with v chunks (each chunk pass costing 1/v) shrinks the fill and drain
// to 3(p-1)/v, so the bubble is exactly (p-1)/(v*m + p-1) (asserted to 1e-9: the costs are
// multiples of 1/v, summed in double). Its ratio to 1F1B's bubble, (m+p-1)/(v*m+p-1), is within
// (p-1)/(v*m) of 1/v: for m = 8p, below 1/(8v), which we assert.
TEST(PipelineSchedule, InterleavedBubbleIsAboutOneOverV) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 8 * p; m += p) {
      for (int v = 2; v <= 4; ++v) {
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " v=" << v);
        const auto r = simulate(make_schedule(kInterleaved, p, m, v));
        EXPECT_NEAR(r.bubble_fraction, bubble_formula(kInterleaved, p, m, v), 1e-9);
        for (double b : r.busy) EXPECT_NEAR(b, 3.0 * m, 1e-9);  // same total work for every v
        if (p > 1 && m == 8 * p) {
          const auto one = simulate(make_schedule(k1F1B, p, m));
          EXPECT_NEAR(r.bubble_fraction / one.bubble_fraction, 1.0 / v, 1.0 / (8 * v));
        }
      }
    }
  }
}

// Property: the dependencies follow Note [Pipeline dependencies]: an interleaved chunk-1
// forward on rank 0 receives from the last rank's chunk 0; a backward at the last virtual stage
// needs only its own forward; a weight pass needs its own input pass.
TEST(PipelineSchedule, Dependencies) {
  using td::parallel::dependencies;
  using td::parallel::Event;
  EXPECT_TRUE(dependencies({ActionKind::Forward, 3, 0}, 0, 4, 2).empty());
  auto d = dependencies({ActionKind::Forward, 3, 1}, 0, 4, 2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].event, Event::ForwardDone);
  EXPECT_EQ(d[0].stage, 3);
  EXPECT_EQ(d[0].rank, 3);
  EXPECT_EQ(d[0].microbatch, 3);
  d = dependencies({ActionKind::Backward, 2, 1}, 3, 4, 2);  // stage 7, the last
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].event, Event::ForwardDone);
  EXPECT_EQ(d[0].rank, 3);
  d = dependencies({ActionKind::BackwardInput, 2, 0}, 1, 4, 1);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].event, Event::InputGradDone);
  EXPECT_EQ(d[1].stage, 2);
  EXPECT_EQ(d[1].rank, 2);
  d = dependencies({ActionKind::BackwardWeight, 2, 0}, 1, 4, 1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].event, Event::InputGradDone);
  EXPECT_EQ(d[0].rank, 1);
}

void expect_rejected(const PipelineSchedule& s, const std::vector<std::string>& parts) {
  const std::string e = error_of([&] { validate(s); });
  ASSERT_FALSE(e.empty()) << "validate accepted a broken schedule";
  for (const auto& part : parts) EXPECT_NE(e.find(part), std::string::npos) << e;
}

// Property: validate rejects hand-broken schedules, naming the rank, the action and the rule.
TEST(PipelineSchedule, ValidateRejectsBrokenSchedules) {
  // A backward before its forward on rank 2.
  auto s = make_schedule(k1F1B, 4, 6);  // rank 2: F0 F1 B0 ... -> B0 F0 F1 ...
  s.actions[2].erase(s.actions[2].begin() + 2);
  s.actions[2].insert(s.actions[2].begin(), Action{ActionKind::Backward, 0, 0});
  expect_rejected(s, {"rank 2 action 0 (B0c0)", "before the forward"});

  // A missing action.
  s = make_schedule(kGPipe, 3, 4);
  s.actions[1].pop_back();
  expect_rejected(s, {"rank 1", "missing", "B3c0"});
  s = make_schedule(kGPipe, 3, 4);
  s.actions[0].erase(s.actions[0].begin() + 1);
  expect_rejected(s, {"rank 0", "before the forward of micro-batch 1"});

  // A cross-rank cycle: rank 0 runs B0 before F1, rank 1 runs F1 before B0. B0 on rank 0 waits
  // for rank 1's B0, which waits for rank 1's F1, which waits for rank 0's F1.
  s = make_schedule(kGPipe, 2, 2);
  s.actions[0] = {{ActionKind::Forward, 0, 0},
                  {ActionKind::Backward, 0, 0},
                  {ActionKind::Forward, 1, 0},
                  {ActionKind::Backward, 1, 0}};
  expect_rejected(s, {"deadlock", "rank 0 blocks at action 1 (B0c0)", "rank 1 blocks at action 1",
                      "input gradient of micro-batch 0 at virtual stage 1 (rank 1)",
                      "forward of micro-batch 1 at virtual stage 0 (rank 0)"});

  // A duplicated action, a foreign micro-batch and chunk, a weight pass before its input pass,
  // a mixed full/split backward, and the wrong number of ranks.
  s = make_schedule(k1F1B, 2, 2);
  s.actions[1].push_back(s.actions[1][0]);
  expect_rejected(s, {"rank 1", "F0c0 twice"});
  s = make_schedule(k1F1B, 2, 2);
  s.actions[0][0].microbatch = 5;
  expect_rejected(s, {"rank 0", "micro-batch 5 is outside [0, 2)"});
  s = make_schedule(k1F1B, 2, 2);
  s.actions[1][0].chunk = 1;
  expect_rejected(s, {"rank 1", "chunk 1 is outside [0, 1)"});
  s = make_schedule(kZB, 2, 3);
  auto& z = s.actions[1];
  const auto w = std::find(z.begin(), z.end(), Action{ActionKind::BackwardWeight, 0, 0});
  z.erase(w);
  z.insert(z.begin() + 1, Action{ActionKind::BackwardWeight, 0, 0});
  expect_rejected(s, {"rank 1", "W0c0", "before its input-gradient backward"});
  s = make_schedule(kZB, 2, 3);
  s.actions[0].push_back({ActionKind::Backward, 1, 0});
  expect_rejected(s, {"rank 0", "both a full backward B1c0 and a split one"});
  s = make_schedule(k1F1B, 3, 3);
  s.actions.pop_back();
  expect_rejected(s, {"2 action lists for 3 pipeline stages"});
}

// Property: bad arguments are td::Errors that say what is wrong.
TEST(PipelineSchedule, BadArguments) {
  EXPECT_NE(error_of([] { make_schedule(k1F1B, 0, 4); }).find("1f1b schedule: pipeline stages"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(kGPipe, 2, 0); }).find("micro-batches must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(kInterleaved, 2, 4, 0); }).find("chunks per rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(kZB, 2, 4, 2); }).find("'interleaved' schedule"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(kInterleaved, 2, 4, 1); }).find("at least 2 model chunks"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_schedule(kInterleaved, 4, 3, 2);
            }).find("interleaved schedule: 3 micro-batches < 4 pipeline stages"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_schedule(kInterleaved, 4, 6, 2);
            }).find("6 micro-batches is not a multiple of the 4 pipeline stages"),
            std::string::npos);
  EXPECT_NE(error_of([] { bubble_formula(kInterleaved, 4, 3, 2); }).find("3 micro-batches < 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              td::parallel::parse_schedule_kind("pipedream");
            }).find("valid schedules: gpipe, 1f1b, interleaved, zb"),
            std::string::npos);
  EXPECT_EQ(td::parallel::parse_schedule_kind("zb"), kZB);
  EXPECT_EQ(td::parallel::parse_schedule_kind("1f1b"), k1F1B);
  EXPECT_EQ(td::parallel::parse_action_kind("I"), ActionKind::BackwardInput);
  EXPECT_THROW(td::parallel::parse_action_kind("X"), td::Error);
  EXPECT_NE(error_of([] { simulate(make_schedule(k1F1B, 2, 2), -1); }).find("costs must be"),
            std::string::npos);
}

// Property: the Chrome trace has one "X" event per action with pid = rank, ts/dur in
// microseconds, a distinct color per kind, and survives a dump/parse round trip.
TEST(PipelineSchedule, ChromeTrace) {
  const auto s = make_schedule(kZB, 3, 4);
  const auto r = simulate(s, 0.5, 0.25, 0.125);  // powers of two: exact microsecond values
  const auto trace = td::json::parse(td::json::dump(td::parallel::chrome_trace(r.timeline)));
  const auto& events = trace.at("traceEvents").as_array();
  size_t x = 0, meta = 0;
  std::map<std::string, std::string> color_of_kind;
  for (const auto& e : events) {
    if (e.at("ph").as_string() == "M") {
      ++meta;
      continue;
    }
    ASSERT_EQ(e.at("ph").as_string(), "X");
    const auto& args = e.at("args");
    const int rank = static_cast<int>(e.at("pid").as_int());
    const auto& t = r.timeline[rank][x % 12];  // 3 ranks x 12 actions, in rank order
    EXPECT_EQ(args.at("microbatch").as_int(), t.action.microbatch);
    EXPECT_EQ(args.at("chunk").as_int(), 0);
    EXPECT_EQ(e.at("name").as_string(),
              std::string(action_kind_code(t.action.kind)) + std::to_string(t.action.microbatch));
    EXPECT_DOUBLE_EQ(e.at("ts").as_double(), t.start * 1e6);
    EXPECT_DOUBLE_EQ(e.at("dur").as_double(), (t.end - t.start) * 1e6);
    color_of_kind[args.at("kind").as_string()] = e.at("cname").as_string();
    ++x;
  }
  EXPECT_EQ(x, 3u * 12u);
  EXPECT_EQ(meta, 3u);
  EXPECT_EQ(color_of_kind.size(), 3u);  // F, I, W
  std::set<std::string> colors;
  for (const auto& [k, c] : color_of_kind) colors.insert(c);
  EXPECT_EQ(colors.size(), 3u);
  // Interleaved traces name the chunk.
  const auto ri = simulate(make_schedule(kInterleaved, 2, 2, 2));
  const auto ti = td::parallel::chrome_trace(ri.timeline);
  EXPECT_EQ(ti.at("traceEvents").as_array()[1].at("name").as_string(), "F0c0");
}

}  // namespace
