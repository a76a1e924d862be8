// The training configuration (one field table: python/tardelli/train/config.py's TrainConfig is
// made from it): defaults, the reading order (defaults < TOML < flags), argparse's command-line
// rules and the error texts the Python front end also shows.
#include "tardelli/train/train_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tardelli/core/cuda_runtime.h"
#include "tardelli/core/json.h"
#include "test_util.h"

namespace td::train {
namespace {

using Argv = std::vector<std::string>;

const Argv kBase = {"--synthetic-data", "--vocab-size", "64"};

Argv with_base(const Argv& extra) {
  Argv out = kBase;
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// The ConfigError text of parse_config(argv, world) ("" when it succeeds; a non-config error
// fails the test).
std::string config_error(const Argv& argv, int world = 1) {
  try {
    parse_config(argv, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool usage_error(const Argv& argv) {
  try {
    read_config(argv);
  } catch (const ConfigError& e) {
    return e.usage();
  }
  return false;
}

// ---- the field table ----

TEST(TrainConfigTable, DefaultsAreTheDocumentedOnes) {
  const TrainConfig c;
  EXPECT_EQ(c.arch, "gpt2");
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.d_model, 256);
  EXPECT_EQ(c.seq_len, 256);
  EXPECT_EQ(c.dtype, "fp32");
  EXPECT_EQ(c.moe_top_k, 2);
  EXPECT_EQ(c.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.lr, 6e-4);
  EXPECT_EQ(c.min_lr, -1.0);
  EXPECT_DOUBLE_EQ(c.min_lr_value(), 6e-5);
  EXPECT_EQ(c.lr_decay_style, "cosine");
  EXPECT_EQ(c.beta2, 0.95);
  EXPECT_EQ(c.eps, 1e-8);
  EXPECT_EQ(c.initial_loss_scale, 65536.0);
  EXPECT_EQ(c.seed, 1337);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.split, "98,1,1");
  EXPECT_FALSE(c.synthetic_data);
  EXPECT_EQ(c.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(c.cp_comm, "ring");
  EXPECT_EQ(c.schedule, "1f1b");
  EXPECT_EQ(c.recompute, "selective");
  EXPECT_EQ(c.fp8_amax_history, 16);
  EXPECT_EQ(c.precision_fp8_overflow, 1e-2);
  EXPECT_EQ(c.precision_stable_steps, 100);
  EXPECT_EQ(c.topk_ratio, 0.01);
  EXPECT_EQ(c.ddp_bucket_mb, 40.0);
  EXPECT_EQ(c.eval_interval, 100);
  EXPECT_TRUE(c.progress);
  EXPECT_EQ(c.on_nonfinite, "raise");
  EXPECT_EQ(c.max_skipped_steps, 5);
  EXPECT_EQ(c.straggler_threshold, 1.2);
  // A command line of only the data source parses to exactly these.
  const TrainConfig parsed = parse_config(kBase);
  json::Value want = to_json(TrainConfig{});
  want.set("synthetic_data", true);
  want.set("vocab_size", 64);
  EXPECT_EQ(json::dump(to_json(parsed)), json::dump(want));
}

TEST(TrainConfigTable, JsonForCheckpointsAndOtherFrontEnds) {
  // Property: to_json is Python's to_dict (field order, Python's numbers), from_json inverts it
  // with config.py's coercion, fields_json describes each flag for an argparse built from it.
  const std::string dumped = json::dump(to_json(TrainConfig{}));
  EXPECT_EQ(dumped.substr(0, 40), R"({"arch":"gpt2","layers":4,"d_model":256,)");
  EXPECT_NE(dumped.find(R"("lr":0.0006,"min_lr":-1.0,)"), std::string::npos);
  EXPECT_NE(dumped.find(R"("progress":true,)"), std::string::npos);
  TrainConfig c;
  c.layers = 7;
  c.lr = 1e-3;
  c.data = "x";
  EXPECT_EQ(json::dump(to_json(from_json(to_json(c)))), json::dump(to_json(c)));
  const TrainConfig coerced = from_json(json::parse(R"({"lr": 1, "layers": 3.0})"));
  EXPECT_EQ(coerced.lr, 1.0);
  EXPECT_EQ(coerced.layers, 3);
  EXPECT_EQ(test::error_of([] { from_json(json::parse(R"({"layers": 3.5})"), "meta"); }),
            "meta: 'layers' must be int, got 3.5");
  EXPECT_EQ(test::error_of([] { from_json(json::parse(R"({"layer": 3})"), "meta"); }),
            "meta: unknown key 'layer'");

  const json::Value rows = fields_json();
  ASSERT_EQ(rows.size(), fields().size());
  const json::Value& arch = rows.as_array()[0];
  EXPECT_EQ(json::dump(arch),
            R"({"name":"arch","flag":"--arch","type":"str","default":"gpt2","help":"gpt2 | )"
            R"(llama","choices":["gpt2","llama"],"metavar":"{gpt2,llama}"})");
  const Field* f = find_field("micro-batch-size");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->flag(), "--micro-batch-size");
  EXPECT_EQ(f->metavar(), "MICRO_BATCH_SIZE");
  EXPECT_EQ(find_field("nope"), nullptr);
}

// ---- TOML ----

class TrainConfigToml : public test::TempDirTest {
 protected:
  std::string toml(const std::string& text) {
    const std::string p = path("c.toml");
    test::write_bytes(p, text);
    return p;
  }
};

TEST_F(TrainConfigToml, TablesFlattenDashKeysAndFlagsOverride) {
  // Property: defaults < TOML (tables flattened, '-' or '_' keys) < flags (config.py's test).
  const std::string f = toml(
      "[model]\nlayers = 3\nd-model = 96\nheads = 3\n[train]\nlr = 1\n"
      "synthetic_data = true\nvocab_size = 50\n[deep.er]\nmicro-batch_size = 4.0\n");
  const TrainConfig c = parse_config({"--config", f, "--layers", "5"});
  EXPECT_EQ(c.layers, 5);
  EXPECT_EQ(c.d_model, 96);
  EXPECT_EQ(c.heads, 3);
  EXPECT_EQ(c.lr, 1.0);  // an integer for a float field
  EXPECT_EQ(c.vocab_size, 50);
  EXPECT_EQ(c.micro_batch_size, 4);  // an integral float for an int field
  EXPECT_TRUE(c.synthetic_data);
  const json::Object flat = load_toml(f);
  ASSERT_EQ(flat.size(), 7u);
  EXPECT_EQ(flat[0].first, "layers");  // file order, names normalized
  EXPECT_EQ(flat[1].first, "d_model");
  EXPECT_EQ(flat[6].first, "micro_batch_size");
  // A flag overrides the file whichever comes first on the command line.
  EXPECT_EQ(parse_config({"--d-model", "60", "--heads", "4", "--config", f}).d_model, 60);
}

TEST_F(TrainConfigToml, BadFilesAreRefusedNamingTheFileAndKey) {
  std::string f = toml("layer = 3\n");
  std::string e = config_error({"--config", f});
  EXPECT_EQ(e.rfind("--config " + f +
                        ": unknown key 'layer' in top level (known: arch, "
                        "async_save, beta1, beta2, clip_grad, ",
                    0),
            0u)
      << e;
  EXPECT_NE(e.find(", warmup_steps, weight_decay, zero)"), std::string::npos) << e;
  f = toml("[model]\nlayers = 3\n[model.sub]\nbogus-key = 1\n");
  EXPECT_NE(config_error({"--config", f}).find("unknown key 'bogus-key' in [model][sub] (known:"),
            std::string::npos);
  f = toml("[a]\nlayers = 3\n[b]\nlayers = 4\n");
  EXPECT_EQ(config_error({"--config", f}), "--config " + f + ": key 'layers' is given twice");
  f = toml("d_model = 3\nd-model = 4\n");
  EXPECT_EQ(config_error({"--config", f}), "--config " + f + ": key 'd-model' is given twice");
  f = toml("layers = \"three\"\n");
  EXPECT_EQ(config_error({"--config", f}), "--config " + f + ": 'layers' must be int, got 'three'");
  f = toml("layers = 2.5\n");
  EXPECT_EQ(config_error({"--config", f}), "--config " + f + ": 'layers' must be int, got 2.5");
  f = toml("synthetic_data = 1\n");
  EXPECT_EQ(config_error({"--config", f}),
            "--config " + f + ": 'synthetic_data' must be bool, got 1");
  f = toml("data = [1, \"a\", true]\n");
  EXPECT_EQ(config_error({"--config", f}),
            "--config " + f + ": 'data' must be str, got [1, 'a', True]");
  f = toml("data = 1979-05-27\n");
  EXPECT_EQ(config_error({"--config", f}),
            "--config " + f + ": 'data' must be str, got datetime.date(1979, 5, 27)");
  f = toml("lr = true\n");
  EXPECT_EQ(config_error({"--config", f}), "--config " + f + ": 'lr' must be float, got True");
  f = toml("[model\nlayers = 3\n");
  e = config_error({"--config", f});
  EXPECT_EQ(e.rfind("--config " + f + ": not valid TOML: ", 0), 0u) << e;
  EXPECT_NE(e.find("(at line 1, column"), std::string::npos) << e;
  EXPECT_EQ(config_error({"--config", path("missing.toml")}),
            "--config: file not found: " + path("missing.toml"));
  // A value outside the choices from a file is validate()'s error (the parser checks flags).
  f = toml("[train]\non-nonfinite = \"bogus\"\n");
  EXPECT_EQ(config_error(with_base({"--config", f})),
            "--on-nonfinite: unknown value 'bogus' (choose from raise, skip)");
}

// ---- the command line ----

TEST(TrainConfigArgv, FlagFormsAreArgparses) {
  // --name value, --name=value, unique prefixes, --flag / --no-flag (the last one wins),
  // negative numbers as values, Python's int() and float() spellings.
  TrainConfig c = read_config({"--layers=6", "--d-model", "128", "--synthetic-data", "--no-prog",
                               "--seq-l", "64", "--lr", "1_0.5", "--min-lr", "-1",
                               "--max-skipped-steps", " 1_0 ", "--data="});
  EXPECT_EQ(c.layers, 6);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_TRUE(c.synthetic_data);
  EXPECT_FALSE(c.progress);
  EXPECT_EQ(c.seq_len, 64);
  EXPECT_EQ(c.lr, 10.5);
  EXPECT_EQ(c.min_lr, -1.0);
  EXPECT_EQ(c.max_skipped_steps, 10);
  EXPECT_EQ(c.data, "");
  c = read_config({"--synthetic-data", "--no-synthetic-data", "--progress", "--fp8-margin",
                   "Infinity", "--arch", "llama", "--arch=gpt2"});
  EXPECT_FALSE(c.synthetic_data);
  EXPECT_TRUE(c.progress);
  EXPECT_TRUE(std::isinf(c.fp8_margin));
  EXPECT_EQ(c.arch, "gpt2");
  EXPECT_EQ(read_config({"--data", "-a b"}).data, "-a b");  // a value with a space is no flag
}

TEST(TrainConfigArgv, BadCommandLinesAreArgparsesErrors) {
  auto err = [](const Argv& argv) { return test::error_of([&] { read_config(argv); }); };
  EXPECT_EQ(err({"--foo", "3", "--bar"}), "unrecognized arguments: --foo 3 --bar");
  EXPECT_EQ(err({"--layers", "3", "stray"}), "unrecognized arguments: stray");
  EXPECT_EQ(err({"--layers", "3", "--", "x"}), "unrecognized arguments: -- x");
  EXPECT_EQ(err({"--arch", "bert"}),
            "argument --arch: invalid choice: 'bert' (choose from 'gpt2', 'llama')");
  EXPECT_EQ(err({"--on-nonfinite", "bogus"}),
            "argument --on-nonfinite: invalid choice: 'bogus' (choose from 'raise', 'skip')");
  EXPECT_EQ(err({"--layers", "x"}), "argument --layers: invalid int value: 'x'");
  EXPECT_EQ(err({"--layers", "3.0"}), "argument --layers: invalid int value: '3.0'");
  EXPECT_EQ(err({"--layers=3=4"}), "argument --layers: invalid int value: '3=4'");
  EXPECT_EQ(err({"--lr", "fast"}), "argument --lr: invalid float value: 'fast'");
  EXPECT_EQ(err({"--layers"}), "argument --layers: expected one argument");
  EXPECT_EQ(err({"--layers", "-x"}), "argument --layers: expected one argument");
  EXPECT_EQ(err({"--lr", "-1e3"}), "argument --lr: expected one argument");  // as argparse
  EXPECT_EQ(err({"--synthetic-data=1"}),
            "argument --synthetic-data/--no-synthetic-data: ignored explicit argument '1'");
  EXPECT_EQ(err({"--moe", "1"}),
            "ambiguous option: --moe could match --moe-top-k, --moe-ffn-hidden, "
            "--moe-layer-freq, --moe-shared-experts, --moe-aux-loss-coeff, --moe-z-loss-coeff, "
            "--moe-router-bias-update-rate, --moe-capacity-factor");
  EXPECT_TRUE(usage_error({"--foo"}));
  EXPECT_TRUE(usage_error({"--arch", "bert"}));
  // A bad value found after parsing is a ConfigError but not a usage error.
  try {
    parse_config({"--layers", "0"});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_FALSE(e.usage());
  }
}

TEST(TrainConfigArgv, HelpListsEveryFlag) {
  // Property: -h/--help (or a unique prefix) is not an error: HelpRequested carries the text,
  // which shows every flag with its help; flags before it are still checked.
  std::string help;
  try {
    read_config({"--layers", "3", "--hel"});
  } catch (const HelpRequested& h) {
    help = h.text();
  }
  EXPECT_EQ(help, help_text());
  EXPECT_EQ(help.rfind("usage: tardelli-train [-h] [--config CONFIG] [--arch {gpt2,llama}]", 0), 0u)
      << help;
  EXPECT_NE(help.find("Train a GPT (see docs/training.md)."), std::string::npos);
  EXPECT_NE(help.find("  -h, --help            show this help message and exit\n"),
            std::string::npos);
  EXPECT_NE(help.find("  --layers LAYERS       transformer blocks\n"), std::string::npos);
  EXPECT_NE(help.find("  --synthetic-data, --no-synthetic-data\n"), std::string::npos);
  EXPECT_NE(help.find("block i is an MoE block iff i % F == 0"), std::string::npos);
  for (const Field& f : fields()) EXPECT_NE(help.find(f.flag()), std::string::npos) << f.name;
  EXPECT_THROW(read_config({"-h"}), HelpRequested);
  EXPECT_EQ(test::error_of([] {
              read_config({"--layers", "x", "--help"});
            }),
            "argument --layers: invalid int value: 'x'");
  EXPECT_EQ(test::error_of([] { read_config({"-hx"}); }),
            "argument -h/--help: ignored explicit argument 'x'");
  EXPECT_EQ(usage_text("prog").rfind("usage: prog [-h]", 0), 0u);
}

// ---- validate: config.py's rules and texts ----

struct Rule {
  Argv argv;
  int world;
  std::string message;  // the whole text, or a prefix ending in "..."
};

class TrainConfigRules : public ::testing::TestWithParam<Rule> {};

TEST_P(TrainConfigRules, RefusedWithConfigPysText) {
  const Rule& r = GetParam();
  const std::string e = config_error(r.argv, r.world);
  if (r.message.ends_with("...")) {
    const std::string prefix = r.message.substr(0, r.message.size() - 3);
    EXPECT_EQ(e.substr(0, prefix.size()), prefix) << e;
  } else {
    EXPECT_EQ(e, r.message);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, TrainConfigRules,
    ::testing::Values(
        // tests/python/test_train.py
        Rule{with_base({"--d-model", "60", "--heads", "8"}), 1,
             "--heads 8 does not divide --d-model 60"},
        Rule{with_base({"--kv-heads", "3", "--arch", "llama"}), 1,
             "--kv-heads 3 does not divide --heads 4"},
        Rule{with_base({"--kv-heads", "2"}), 1,
             "--kv-heads 2: grouped-query attention needs --arch llama"},
        Rule{{}, 1, "give exactly one data source: --data PREFIX or --synthetic-data"},
        Rule{with_base({"--data", "x"}), 1, "--data and --synthetic-data exclude each other"},
        Rule{{"--data", "/nonexistent/prefix"},
             1,
             "--data /nonexistent/prefix: /nonexistent/prefix.idx not found (make it with "
             "python -m tardelli.data.preprocess)"},
        Rule{{"--synthetic-data"}, 1, "--synthetic-data needs --vocab-size"},
        Rule{with_base({"--global-batch-size", "6"}), 1,
             "--global-batch-size 6 is not a multiple of --micro-batch-size 8 x data-parallel "
             "size 1"},
        Rule{with_base({"--split", "1,2"}), 1,
             "--split must be three non-negative ratios with train > 0, e.g. 98,1,1; got '1,2'"},
        Rule{with_base({"--split", "0,1,1"}), 1, "--split must be three..."},
        Rule{with_base({"--resume"}), 1, "--resume needs --save DIR (where the checkpoints are)"},
        Rule{with_base({"--async-save"}), 1, "--async-save needs --save DIR"},
        Rule{with_base({"--device", "tpu"}), 1,
             "--device: expected cpu, cuda or cuda:N, got 'tpu'"},
        Rule{with_base({"--steps", "8", "--warmup-steps", "100"}), 1,
             "--warmup-steps 100 exceeds --steps 8"},
        // sizes
        Rule{with_base({"--layers", "0"}), 1, "--layers must be > 0, got 0"},
        Rule{with_base({"--micro-batch-size", "-2"}), 1, "--micro-batch-size must be > 0, got -2"},
        Rule{with_base({"--eval-steps", "-1"}), 1, "--eval-steps must be >= 0, got -1"},
        // parallelism
        Rule{with_base({"--tp", "2"}), 3,
             "--tp 2 x --cp 1 x --pp 1 does not divide the 3 ranks of this job"},
        Rule{with_base({"--tp", "3"}), 3,
             "--tp 3 does not divide --heads 4 (attention splits heads)"},
        Rule{with_base({"--tp", "0"}), 1, "--tp must be >= 1, got 0"},
        Rule{with_base({"--sequence-parallel"}), 1,
             "--sequence-parallel needs tensor parallelism (--tp > 1)"},
        Rule{with_base({"--vpp", "2"}), 1, "--vpp 2 needs --schedule interleaved"},
        Rule{with_base({"--schedule", "interleaved"}), 1,
             "--schedule interleaved needs --vpp >= 2 model chunks per rank"},
        Rule{with_base({"--pp", "2", "--vpp", "2", "--schedule", "interleaved"}), 2,
             "--schedule interleaved: the 1 micro-batches per step (global batch / (micro batch "
             "x dp)) must be a multiple of --pp 2 and at least 2"},
        Rule{with_base({"--pp", "2", "--pipeline-layout", "1,2"}), 2,
             "--pipeline-layout '1,2' must list 2 positive layer counts (--pp x --vpp) summing "
             "to --layers 4"},
        Rule{with_base({"--pp", "2", "--pipeline-layout", "1,x"}), 2,
             "--pipeline-layout '1,x' must list 2..."},
        Rule{with_base({"--pp", "2", "--layers", "3"}), 2,
             "--layers 3 is not divisible by --pp 2 x --vpp 1 (or give --pipeline-layout)"},
        Rule{with_base({"--recompute-layers", "1"}), 1,
             "--recompute-layers 1 selects blocks for full recomputation: it needs --recompute "
             "full (got --recompute selective)"},
        Rule{with_base({"--recompute", "full", "--recompute-layers", "3", "--pp", "2"}), 2,
             "--recompute-layers 3 exceeds the 2 layers of pipeline stage 0 (--layers 4, --pp 2, "
             "--vpp 1): full recomputation applies to the first N blocks of every stage"},
        Rule{with_base({"--recompute", "full", "--recompute-layers", "2", "--pp", "2",
                        "--pipeline-layout", "3,1"}),
             2,
             "--recompute-layers 2 exceeds the 1 layers of pipeline stage 1 (--layers 4, --pp 2, "
             "--vpp 1, --pipeline-layout 3,1): full recomputation applies to the first N blocks "
             "of every stage"},
        Rule{with_base({"--zero", "4"}), 1, "--zero must be 0, 1, 2 or 3, got 4"},
        Rule{with_base({"--offload-optimizer"}), 1,
             "--offload-optimizer needs --zero 1, 2 or 3..."},
        Rule{with_base({"--zero", "2", "--schedule", "zb"}), 1,
             "--zero 2 with --schedule zb is not supported yet..."},
        Rule{with_base({"--cp", "2", "--seq-len", "6"}), 2,
             "--cp 2: --seq-len 6 must be divisible by 2 x cp = 4 (the zigzag layout cuts each "
             "sequence into 2 x cp chunks)"},
        Rule{with_base({"--cp", "2", "--zero", "2"}), 2,
             "--zero 2 with --cp 2: ZeRO-2/3 over the dp x cp group is not supported yet (use "
             "--zero 0 or 1)"},
        // mixture of experts
        Rule{with_base({"--ep", "2"}), 2,
             "--ep 2: expert parallelism needs a mixture-of-experts model (--num-experts)"},
        Rule{with_base({"--num-experts", "4", "--moe-top-k", "5"}), 1,
             "--moe-top-k 5 must be in [1, --num-experts 4]"},
        Rule{with_base({"--num-experts", "4", "--ep", "2"}), 1,
             "--ep 2 does not divide the data-parallel size 1 (ranks / (tp x cp x pp)): the ep "
             "ranks are data-parallel ranks of the dense layers"},
        Rule{with_base({"--moe-aux-loss-coeff", "-1"}), 1,
             "--moe-aux-loss-coeff must be a number >= 0, got -1.0"},
        Rule{with_base({"--moe-layer-freq", "0"}), 1, "--moe-layer-freq must be >= 1, got 0"},
        // precision
        Rule{with_base({"--precision-fp8-error", "-1"}), 1,
             "--precision-fp8-error must be >= 0, got -1.0"},
        Rule{with_base({"--precision-policy", "adaptive", "--zero", "3"}), 1,
             "--precision-policy adaptive with --zero 3: bf16/fp32 linears and the statistics "
             "need the fp32 weights, which ZeRO-3 releases between uses"},
        Rule{with_base({"--fp8-margin", "nan"}), 1, "--fp8-margin must be >= 0, got nan"},
        Rule{with_base({"--precision-map", "/nonexistent.json"}), 1,
             "--precision-map /nonexistent.json: [Errno 2] No such file or directory: "
             "'/nonexistent.json'"},
        // communication
        Rule{with_base({"--topk-ratio", "0"}), 1, "--topk-ratio must be in (0, 1], got 0.0"},
        Rule{with_base({"--compression-start-step", "5"}), 1,
             "--compression-start-step applies to --grad-compression"},
        Rule{with_base({"--grad-compression", "topk", "--zero", "2"}), 1,
             "--grad-compression topk with --zero 2: compression works with all-reduced (--zero "
             "0) and ZeRO-1 gradients, not ZeRO-2/3 shards"},
        Rule{with_base({"--ranks-per-node", "2"}), 1,
             "--ranks-per-node applies to --hierarchical-reduce"},
        Rule{with_base({"--ddp-bucket-mb", "0"}), 1, "--ddp-bucket-mb must be > 0, got 0.0"},
        Rule{with_base({"--trace", "t.json"}), 1,
             "--trace records the pipeline timeline: it needs --pp > 1"},
        // optimizer
        Rule{with_base({"--dropout", "1"}), 1, "--dropout must be in [0, 1), got 1.0"},
        Rule{with_base({"--lr", "0"}), 1, "--lr must be > 0, got 0.0"},
        Rule{with_base({"--lr", "1e-5", "--min-lr", "1"}), 1,
             "--min-lr 1.0 is larger than --lr 1e-05"},
        Rule{with_base({"--beta1", "1"}), 1, "--beta1/--beta2 must be in [0, 1), got 1.0, 0.95"},
        Rule{with_base({"--initial-loss-scale", "inf"}), 1,
             "--initial-loss-scale must be a positive number, got inf"},
        Rule{with_base({"--loss-scale-window", "0"}), 1, "--loss-scale-window must be >= 1, got 0"},
        Rule{with_base({"--log-interval", "0"}), 1, "--log-interval must be > 0, got 0"},
        // fault tolerance (tests/python/test_train_faults.py)
        Rule{with_base({"--max-skipped-steps", "0"}), 1, "--max-skipped-steps must be >= 1, got 0"},
        Rule{with_base({"--straggler-threshold", "0.5"}), 1,
             "--straggler-threshold must be 0 (off) or a ratio >= 1, got 0.5"},
        Rule{with_base({"--straggler-threshold", "nan"}), 1,
             "--straggler-threshold must be 0 (off) or a ratio >= 1, got nan"},
        Rule{with_base({"--inject-nonfinite-grad", "0"}), 1,
             "--inject-nonfinite-grad must list step numbers >= 1 separated by commas, got '0'"},
        Rule{with_base({"--inject-nonfinite-loss", "x"}), 1,
             "--inject-nonfinite-loss must list STEP or STEP@RANK (steps >= 1, ranks >= 0) "
             "separated by commas, got 'x'"},
        Rule{with_base({"--inject-nonfinite-loss", "3@-1"}), 1,
             "--inject-nonfinite-loss must list STEP or STEP@RANK..."},
        // the planner
        Rule{with_base({"--plan", "auto"}), 1,
             "--plan auto needs the Python planner (docs/planner.md)..."},
        Rule{with_base({"--plan", "fast"}), 1,
             "--plan: unknown value 'fast' (choose auto, or leave it out)"}));

TEST(TrainConfigRulesCuda, DeviceNeedsCuda) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(config_error(with_base({"--device", "cuda"})),
            std::string("--device cuda: no CUDA device is available (td.cuda.device_count() == "
                        "0; this build has the CUDA backend: ") +
                (cuda_is_built() ? "True" : "False") + ")");
}

TEST(TrainConfigRules, ValidLayoutsPass) {
  // Property: consistent configurations of each family are accepted.
  EXPECT_EQ(config_error(with_base({})), "");
  EXPECT_EQ(config_error(with_base({"--tp", "2", "--sequence-parallel"}), 4), "");
  EXPECT_EQ(config_error(with_base({"--pp", "2", "--vpp", "2", "--schedule", "interleaved",
                                    "--global-batch-size", "16"}),
                         2),
            "");
  EXPECT_EQ(config_error(with_base({"--pp", "2", "--pipeline-layout", "3,1"}), 2), "");
  EXPECT_EQ(config_error(with_base({"--num-experts", "4", "--ep", "2"}), 2), "");
  EXPECT_EQ(config_error(with_base({"--cp", "2", "--cp-comm", "a2a"}), 2), "");
  EXPECT_EQ(config_error(with_base({"--inject-nonfinite-loss", "3,5@1", "--save", "d", "--resume",
                                    "--straggler-threshold", "0"})),
            "");
}

class TrainConfigFiles : public test::TempDirTest {};

TEST_F(TrainConfigFiles, DataPrefixNeedsBothFiles) {
  const std::string prefix = path("corpus");
  test::write_bytes(prefix + ".idx", "");
  test::write_bytes(prefix + ".bin", "");
  EXPECT_EQ(parse_config({"--data", prefix}).data, prefix);
  std::filesystem::remove(prefix + ".bin");
  EXPECT_EQ(config_error({"--data", prefix}),
            "--data " + prefix + ": " + prefix +
                ".bin not found (make it with python -m tardelli.data.preprocess)");
}

TEST_F(TrainConfigFiles, PrecisionMapIsRead) {
  // Property: a JSON or TOML map (nested tables are dotted names) is read and checked against
  // the model; an fp8 entry needs --fp8.
  const std::string js = path("map.json"), tm = path("map.toml");
  test::write_bytes(js, R"({"h": {"1": {"mlp": {"c_fc": "fp8"}}}, "blocks.0.qkv": "bf16"})");
  test::write_bytes(tm, "[h.1.mlp]\nc_fc = \"fp32\"\n[blocks.0]\nqkv = \"bf16\"\n");
  const auto m = read_precision_map(js, 4);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("h.1.mlp.c_fc"), models::LinearPrecision::FP8);
  EXPECT_EQ(m.at("h.0.attn.c_attn"), models::LinearPrecision::BF16);
  EXPECT_EQ(read_precision_map(tm, 4).at("h.1.mlp.c_fc"), models::LinearPrecision::FP32);
  EXPECT_EQ(config_error(with_base({"--precision-map", js})),
            "--precision-map " + js + ": entry 'h.1.mlp.c_fc' is fp8 but --fp8 is none");
  EXPECT_EQ(config_error(with_base({"--precision-map", js, "--fp8", "hybrid"})), "");
  EXPECT_EQ(config_error(with_base({"--precision-map", tm})), "");
  test::write_bytes(js, R"({"h.9.mlp.c_fc": "fp8"})");
  EXPECT_EQ(test::error_of([&] { read_precision_map(js, 4); })
                .rfind("--precision-map " + js +
                           ": precision map entry 'h.9.mlp.c_fc': the model "
                           "has layers 0..3",
                       0),
            0u);
  test::write_bytes(js, R"({"h.0.mlp.c_fc": 8})");
  EXPECT_EQ(test::error_of([&] { read_precision_map(js, 4); }),
            "--precision-map " + js +
                ": entry 'h.0.mlp.c_fc': expected a precision string (fp8, bf16 or fp32), got 8");
  test::write_bytes(js, "[1]");
  EXPECT_EQ(test::error_of([&] { read_precision_map(js, 4); }),
            "--precision-map " + js + ": expected a table of linear names to precisions, got list");
}

// ---- helpers for the training loop ----

TEST(TrainConfigHelpers, DerivedValues) {
  TrainConfig c;
  EXPECT_EQ(accumulation_steps(c, 2), 1);
  c.global_batch_size = 64;
  EXPECT_EQ(accumulation_steps(c, 2), 4);
  c.inject_nonfinite_grad = "3, 5,,3";
  EXPECT_EQ(inject_steps(c), (std::set<int64_t>{3, 5}));
  c.inject_nonfinite_loss = "3,5@1";
  EXPECT_EQ(inject_loss_steps(c), (std::set<std::pair<int64_t, int>>{{3, -1}, {5, 1}}));
  c.inject_nonfinite_loss = "3@1@2";
  EXPECT_THROW(inject_loss_steps(c), ConfigError);
  EXPECT_EQ(split_ratios(c), (std::array<double, 3>{98, 1, 1}));
  c.split = "1,2";
  EXPECT_THROW(split_ratios(c), ConfigError);
  EXPECT_TRUE(pipeline_layout_counts(c).empty());
  c.pipeline_layout = "3, 5";
  EXPECT_EQ(pipeline_layout_counts(c), (std::vector<int64_t>{3, 5}));
  c.min_lr = 0;
  EXPECT_EQ(c.min_lr_value(), 0.0);
  EXPECT_EQ(kResumeKeys.size(), 5u);
  for (std::string_view k : kResumeKeys) EXPECT_NE(find_field(k), nullptr) << k;
}

}  // namespace
}  // namespace td::train
