"""The layout planner (python/tardelli/plan, docs/planner.md): profile validation, the model's
formulas on small cases (parameter bytes exactly as the allocator counts them, activation bytes
against docs/memory.md's table, the peak of a real one-rank run, bubble fractions against the
schedule simulation), the enumeration's validity rules against an independent statement of the
trainer's rules, and clear errors for bad input."""
import copy
import itertools
import json
import os
import subprocess
import sys

import pytest

import tardelli as td
from tardelli import plan as P
from tardelli.distributed import pipeline as pipe
from tardelli.plan import calibrate, memory, profile
from tardelli.plan.layout import Layout, ModelSpec
from tardelli.train import config as C

from cli_runner import ENV, ROOT, run

GBS = 8


def toy_profile(cores=2):
    """A small valid profile: made-up but plausible CPU figures (the tests check structure and
    formulas, not this machine's speed)."""
    fit = {"alpha_s": 2e-5, "beta_s_per_byte": 2e-10}
    return {"version": 1, "name": "toy", "cores": cores,
            "gemm": [{"dtype": "fp32", "threads": t, "m": m, "n": m, "k": m,
                      "flops": 2e10 * t * (1 if m >= 256 else 0.5)}
                     for t in (1, 2) for m in (64, 256, 1024)],
            "attention": [{"dtype": "fp32", "threads": t, "seq": 128, "head_dim": 32,
                           "flops": 5e9 * t} for t in (1, 2)],
            "bandwidth": [{"threads": t, "bytes_per_s": 8e9 * t} for t in (1, 2)],
            "op_overhead_s": 5e-6, "block_overhead_s": {"gpt2": 1e-4, "llama": 1e-4},
            "step_overhead_s": {"1": 2e-3, "2": 4e-3, "4": 8e-3},
            "collectives": {op: {"2": fit, "4": fit} for op in profile.COLLECTIVES},
            "overlap": 0.5, "allocator": "td_cpu", "memory_bytes": 1 << 33}


def cfg_of(*flags):
    args = C.build_parser().parse_args(list(flags) + ["--synthetic-data"])
    return C.TrainConfig(**{k: getattr(args, k) for k in C._FIELDS
                            if getattr(args, k) is not None})


TINY = ["--layers", "4", "--d-model", "64", "--heads", "4", "--seq-len", "32",
        "--vocab-size", "256"]


# ---- profiles ---------------------------------------------------------------------------------

def test_profile_unknown_key_is_an_error_naming_it():
    p = toy_profile()
    p["gemmm"] = []
    with pytest.raises(profile.ProfileError, match="unknown key 'gemmm'"):
        profile.validate(p)
    p = toy_profile()
    p["collectives"]["all_reduce"]["2"]["gamma"] = 1.0
    with pytest.raises(profile.ProfileError,
                       match=r"collectives\.all_reduce\.2: unknown key 'gamma'"):
        profile.validate(p)


def test_profile_missing_or_mistyped_values_are_errors():
    p = toy_profile()
    del p["bandwidth"]
    with pytest.raises(profile.ProfileError, match="missing key 'bandwidth'"):
        profile.validate(p)
    p = toy_profile()
    p["gemm"][0]["flops"] = -1
    with pytest.raises(profile.ProfileError, match=r"gemm\[0\]\.flops"):
        profile.validate(p)
    p = toy_profile()
    p["overlap"] = 1.5
    with pytest.raises(profile.ProfileError, match="overlap"):
        profile.validate(p)
    p = toy_profile()
    p["param_gather_bytes"] = 3
    with pytest.raises(profile.ProfileError, match="param_gather_bytes: expected 2 or 4"):
        profile.validate(p)


def test_profile_file_errors_name_the_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("{not json")
    with pytest.raises(profile.ProfileError, match="not valid JSON"):
        profile.load(str(f))
    p = toy_profile()
    p["typo_key"] = 1
    f.write_text(json.dumps(p))
    with pytest.raises(profile.ProfileError, match=f"{f}.*unknown key 'typo_key'"):
        profile.load(str(f))


def test_bundled_h100_profile_is_valid():
    from tardelli.plan import megatron
    p = profile.load(megatron.PROFILE)
    assert p["cores"] == 0 and p["ranks_per_node"] == 8


def test_alpha_beta_fit_recovers_a_line():
    """Exact samples of alpha + beta x bytes give back alpha and beta (to rounding)."""
    a, b = 3e-5, 1.5e-10
    fit = calibrate.fit_alpha_beta([(x, a + b * x) for x in (4096, 65536, 1 << 20, 1 << 22)])
    assert fit["alpha_s"] == pytest.approx(a, rel=1e-6)
    assert fit["beta_s_per_byte"] == pytest.approx(b, rel=1e-6)


def test_two_calibration_passes_keep_the_better_figure():
    """calibrate.py Note [Two passes]: figure by figure, the higher rate and the lower overhead
    of two compute passes (a disturbed measurement in one pass does not reach the profile)."""
    def out(scale, ovh):
        return {"gemm": [{"m": 1, "flops": 10.0 * scale}, {"m": 2, "flops": 20.0 / scale}],
                "attention": [{"seq": 64, "flops": 5.0 * scale}],
                "bandwidth": [{"threads": 2, "bytes_per_s": 55e9 / scale}],
                "probes": [{"arch": "gpt2", "block_s": 0.03 * scale, "head_s": 0.04 / scale}],
                "op_overhead_s": ovh, "block_overhead_s_gpt2": 2 * ovh,
                "block_overhead_s_llama": 3 * ovh}
    m = calibrate.best_of_passes(out(1.0, 1e-6), out(2.0, 5e-7))
    assert [g["flops"] for g in m["gemm"]] == [20.0, 20.0]
    assert m["attention"][0]["flops"] == 10.0
    assert m["bandwidth"][0]["bytes_per_s"] == 55e9
    assert m["probes"][0]["block_s"] == 0.03 and m["probes"][0]["head_s"] == 0.02
    assert m["op_overhead_s"] == 5e-7 and m["block_overhead_s_llama"] == 1.5e-6


def test_two_regime_fit_and_lookup():
    """Samples from two lines (below and from 256 KiB) give back both, and the profile's lookup
    uses the one for the message size."""
    small, big = (1e-5, 1e-10), (2e-4, 4e-10)
    xs = [1 << k for k in range(12, 24)]
    samples = [(x, (small if x < calibrate.SPLIT_BYTES else big)[0] +
                (small if x < calibrate.SPLIT_BYTES else big)[1] * x) for x in xs]
    fit = calibrate.fit_regimes(samples)
    assert fit["alpha_s"] == pytest.approx(small[0], rel=1e-6)
    assert fit["beta_large_s_per_byte"] == pytest.approx(big[1], rel=1e-6)
    p = toy_profile()
    p["collectives"]["all_gather"]["2"] = fit
    m = profile.Machine(p)
    assert m.collective_seconds("all_gather", 4096, 2) == pytest.approx(1e-5 + 1e-10 * 4096)
    assert m.collective_seconds("all_gather", 1 << 22, 2) == pytest.approx(
        2e-4 + 4e-10 * (1 << 22))


# ---- memory formulas --------------------------------------------------------------------------

def test_size_class_matches_the_cpu_allocator():
    """A tensor of n bytes raises the allocator's current bytes by size_class(n) exactly."""
    for n in (1, 100, 4096, 300_000, 5_000_000, (1 << 22) + 4):
        before = td.memory_stats()["current_bytes"]
        x = td.empty(n // 4 if n >= 4 else 1)
        nbytes = (n // 4 if n >= 4 else 1) * 4
        assert td.memory_stats()["current_bytes"] - before == memory.size_class(nbytes)
        del x


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_parameter_count_and_bytes_are_exact(arch):
    """The planner's parameter list has the model's count, and its bytes (each tensor in its
    allocator size class) equal what building the model allocates."""
    flags = TINY + ["--arch", arch] + (["--kv-heads", "2"] if arch == "llama" else [])
    cfg = cfg_of(*flags)
    spec = ModelSpec.from_config(cfg)
    from tardelli.train.trainer import model_config
    before = td.memory_stats()["current_bytes"]
    model = td.models.GPT(model_config(cfg, cfg.vocab_size))
    held = td.memory_stats()["current_bytes"] - before
    named = spec.stage_params(0, cfg.layers, True, True, 1, 1, 1)
    assert sum(n for _, n in named) == model.num_parameters() == spec.total_params()
    assert sum(memory.size_class(4 * n) for _, n in named + [("", b) for b in spec.buffers()]) \
        == held
    del model


def test_block_activation_bytes_match_docs_memory_table():
    """docs/memory.md: gpt2, d 768, ff 3072, 12 heads, fp32, 1024 tokens: none 54.1 MiB,
    selective 42.1 MiB, full 3.0 MiB per block (numbers measured by tests/models/
    test_recompute.cpp to 1%)."""
    spec = ModelSpec("gpt2", 12, 768, 12, 12, 3072, 1024, 50257)
    lay = Layout()
    got = {m: memory.block_activation_bytes(spec, lay, 1024, m) / 2 ** 20
           for m in ("none", "selective", "full")}
    assert got["none"] == pytest.approx(54.1, abs=0.05)
    assert got["selective"] == pytest.approx(42.1, abs=0.05)
    assert got["full"] == pytest.approx(3.0, abs=0.05)


def test_tensor_parallel_divides_the_sharded_activation_terms():
    """Under tp 2 with sequence parallelism every term but the gathered norm outputs (2d per
    token) and the fp32 norm statistics halves."""
    spec = ModelSpec("gpt2", 4, 256, 8, 8, 1024, 128, 4096)
    one = memory.block_activation_bytes(spec, Layout(), 512, "selective")
    two = memory.block_activation_bytes(spec, Layout(tp=2, sequence_parallel=True), 512,
                                        "selective")
    norm_out = 4 * 2 * 256 * 512
    assert two == pytest.approx((one - norm_out) / 2 + norm_out, rel=0.01)


@pytest.mark.parametrize("arch,recompute", [("gpt2", "none"), ("gpt2", "selective"),
                                             ("llama", "full"), ("llama", "selective")])
def test_predicted_peak_matches_a_one_rank_run(tmp_path, arch, recompute):
    """The predicted peak of a one-process run is within 3% (the issue's target) of the peak
    the trainer measures (`peak_mem_bytes_max_rank`), on shapes outside the 16 steps the
    block-backward coefficients were fitted to (d 192, 3 layers, 288 tokens, vocab 1536)."""
    flags = ["--arch", arch, "--layers", "3", "--d-model", "192", "--heads", "6",
             "--seq-len", "96", "--vocab-size", "1536", "--micro-batch-size", "3",
             "--recompute", recompute]
    mf = tmp_path / "m.jsonl"
    p = run(1, "tardelli.train", "--synthetic-data", *flags, "--steps", "2",
            "--eval-interval", "0", "--no-progress", "--metrics-file", mf)
    summary = json.loads([x for x in p.stdout.splitlines() if "train_end" in x][-1])
    spec = ModelSpec.from_config(cfg_of(*flags))
    lay = Layout(micro_batch_size=3, recompute=recompute)
    pred, _ = memory.peak_memory(spec, lay, 3)
    meas = summary["peak_mem_bytes_max_rank"]
    assert abs(pred - meas) / meas < 0.03, (pred, meas)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_full_recomputation_peak_with_accumulation(tmp_path, arch):
    """Full recomputation at a large micro-batch with gradient accumulation peaks inside a
    recomputed block's backward (Note [Full recomputation backward]), and gpt2's tied head
    holds its d W there (Note [Tied embedding gradient]): within 3% of the measured peak (the
    model these replaced was 5-6% under on these two)."""
    flags = ["--arch", arch, "--layers", "3", "--d-model", "192", "--heads", "6",
             "--seq-len", "128", "--vocab-size", "1536", "--micro-batch-size", "8",
             "--recompute", "full"]
    p = run(1, "tardelli.train", "--synthetic-data", *flags, "--global-batch-size", "16",
            "--steps", "2", "--eval-interval", "0", "--no-progress")
    summary = json.loads([x for x in p.stdout.splitlines() if "train_end" in x][-1])
    spec = ModelSpec.from_config(cfg_of(*flags))
    pred, bd = memory.peak_memory(spec, Layout(micro_batch_size=8, recompute="full"), 16)
    meas = summary["peak_mem_bytes_max_rank"]
    assert bd["phase"].startswith("backward"), bd
    assert abs(pred - meas) / meas < 0.03, (pred, meas)


@pytest.mark.parametrize("layout_flags", [
    "--tp 2 --pp 1 --cp 1 --sequence-parallel --micro-batch-size 2 --zero 0 --recompute selective",
    "--tp 1 --pp 2 --cp 1 --schedule 1f1b --micro-batch-size 1 --zero 0 --recompute selective",
    "--tp 1 --pp 2 --cp 1 --schedule zb --micro-batch-size 1 --zero 0 --recompute none",
    "--tp 1 --pp 1 --cp 1 --micro-batch-size 2 --zero 2 --recompute full"])
def test_predicted_peak_matches_two_rank_runs(tmp_path, layout_flags):
    """Two-rank layouts (tensor + sequence parallel, a 1F1B and a zero-bubble pipeline (Note
    [Zero-bubble memory]), ZeRO-2 with full recomputation): the predicted peak of the most loaded rank is within 3% of the measured
    `peak_mem_bytes_max_rank`."""
    model = ["--arch", "gpt2", "--layers", "2", "--d-model", "128", "--heads", "4",
             "--seq-len", "64", "--vocab-size", "1024"]
    p = run(2, "tardelli.train", "--synthetic-data", *model, *layout_flags.split(),
            "--global-batch-size", "4", "--steps", "2", "--eval-interval", "0", "--no-progress")
    summary = json.loads([x for x in p.stdout.splitlines() if "train_end" in x][-1])
    spec = ModelSpec.from_config(cfg_of(*model))
    r = P.evaluate(spec, P._parse_flags(layout_flags, 2), 4, profile.Machine(toy_profile()))
    meas = summary["peak_mem_bytes_max_rank"]
    assert abs(r["peak_mem_bytes"] - meas) / meas < 0.03, (r["peak_mem_bytes"], meas)


# ---- step model -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_bubble_is_the_schedule_simulation(kind, vpp):
    """The predicted pipeline time is the schedule simulation's makespan for the stage costs:
    with equal stages its bubble is the textbook (p-1)/(v m + p-1), and the pipeline time is
    m x (one micro-batch's stage time) / (1 - bubble)."""
    cfg = cfg_of(*TINY, "--layers", "8")
    spec = ModelSpec.from_config(cfg)
    machine = profile.Machine(toy_profile())
    lay = Layout(pp=4, vpp=vpp, dp=1, micro_batch_size=1, schedule=kind)
    r = P.evaluate(spec, lay, GBS, machine, 4)
    bd = r["breakdown"]
    m = bd["microbatches"]
    assert m == GBS
    formula = pipe.bubble_formula(kind, 4, m, vpp)
    assert bd["bubble_fraction"] == pytest.approx(formula, abs=1e-3)
    sim = pipe.simulate(pipe.make_schedule(kind, 4, m, vpp))
    assert bd["bubble_fraction"] == pytest.approx(sim.bubble_fraction, abs=1e-3)


def test_bf16_parameter_gathers_halve_zero1_gather_time():
    """param_gather_bytes 2 (Megatron's distributed optimizer gathers bf16 parameters): with
    alpha 0 the ZeRO-1 all-gather takes half the time, the fp32 reduce-scatter the same."""
    def dp(gather_bytes):
        p = toy_profile(cores=0)
        for fits in p["collectives"].values():
            for g in fits:
                fits[g] = {"alpha_s": 0.0, "beta_s_per_byte": 1e-9}
        p["param_gather_bytes"] = gather_bytes
        spec = ModelSpec.from_config(cfg_of(*TINY))
        lay = Layout(dp=2, micro_batch_size=1, zero=1)
        return P.evaluate(spec, lay, GBS, profile.Machine(p), 2)["breakdown"]["dp_comm_ms"]
    # reduce-scatter and all-gather of the same fp32 bytes cost alike in this profile: 2 units
    # with fp32 gathers, 1.5 with bf16 ones.
    assert dp(2) == pytest.approx(dp(4) * 0.75, rel=1e-6)


def test_shared_cores_shrink_the_pipeline_bubble():
    """Note [Shared cores in a pipeline]: 4 ranks on 2 cores (each computes at half speed while
    all compute). With free communication the pp 4 pipeline costs the larger of the schedule at
    full speed and the busiest rank's work at half speed: m x 2 x (one micro-batch's work) here,
    less than the whole schedule at half speed (bubble included) and more than it at full speed.
    One rank per core (cores 4) keeps the schedule's makespan."""
    def model(cores):
        p = toy_profile(cores=cores)
        for fits in p["collectives"].values():
            for g in fits:
                fits[g] = {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
        return profile.Machine(p)
    spec = ModelSpec.from_config(cfg_of(*TINY, "--layers", "8"))
    lay = Layout(pp=4, dp=1, micro_batch_size=1, schedule="1f1b", recompute="none")
    shared = P.evaluate(spec, lay, GBS, model(2), 4)["breakdown"]
    alone = P.evaluate(spec, lay, GBS, model(4), 4)["breakdown"]
    m = alone["microbatches"]
    # At full speed (cores 4, one thread each) the pipeline is m work units / (1 - bubble).
    unit = alone["compute_ms"] / m
    assert alone["pipeline_ms"] == pytest.approx(m * unit / (1 - alone["bubble_fraction"]),
                                                 rel=1e-3)
    # Shared: twice the work per unit, the bubble filled by the other ranks' work.
    assert shared["pipeline_ms"] == pytest.approx(
        max(alone["pipeline_ms"], 2 * m * unit), rel=1e-3)
    assert alone["pipeline_ms"] < shared["pipeline_ms"] < 2 * alone["pipeline_ms"]


def test_shared_core_syncs_charge_each_subgroup_collective():
    """calibrate.py Note [Shared-core syncs]: with 4 ranks on 2 cores every blocking collective
    of a sub-group (tp 2 inside 4 ranks) costs shared_core_sync_s more. gpt2 tp 2 + sp, per
    micro-batch: per block 2 all-gathers and 2 reduce-scatters forward, as many backward plus
    6 small all-reduces of the replicated parameters' gradients (14); the embedding's
    all-reduce, the loss's 2 and the head input's gradient (4): 14 L + 4 syncs. A group that is
    the whole world (tp 4) and a job with a core per rank pay nothing extra."""
    def step(sync, lay, nproc, cores=2):
        p = toy_profile(cores=cores)
        if sync:
            p["shared_core_sync_s"] = sync
        spec = ModelSpec.from_config(cfg_of(*TINY))
        return P.evaluate(spec, lay, GBS, profile.Machine(p), nproc)
    tp2 = Layout(tp=2, dp=2, sequence_parallel=True, micro_batch_size=1, recompute="none")
    base, slow = step(0, tp2, 4), step(1e-3, tp2, 4)
    m, L = base["breakdown"]["microbatches"], 4
    assert slow["step_ms"] - base["step_ms"] == pytest.approx(m * (14 * L + 4) * 1.0, rel=1e-6)
    tp4 = Layout(tp=4, dp=1, sequence_parallel=True, micro_batch_size=1, recompute="none")
    assert step(1e-3, tp4, 4)["step_ms"] == pytest.approx(step(0, tp4, 4)["step_ms"], rel=1e-9)
    assert step(1e-3, tp2, 4, cores=4)["step_ms"] == pytest.approx(
        step(0, tp2, 4, cores=4)["step_ms"], rel=1e-9)
    bad = toy_profile()
    bad["shared_core_sync_s"] = -1
    with pytest.raises(profile.ProfileError, match="shared_core_sync_s"):
        profile.Machine(bad)


def test_more_data_parallel_ranks_do_not_slow_a_step_without_communication():
    """With free collectives and no core sharing, dp 2 does half the micro-batches of dp 1."""
    p = toy_profile(cores=0)
    for fits in p["collectives"].values():
        for g in fits:
            fits[g] = {"alpha_s": 0.0, "beta_s_per_byte": 0.0}
    p["step_overhead_s"] = {"1": 0.0}
    machine = profile.Machine(p)
    spec = ModelSpec.from_config(cfg_of(*TINY))
    one = P.evaluate(spec, Layout(micro_batch_size=1), GBS, machine, 1)
    two = P.evaluate(spec, Layout(dp=2, micro_batch_size=1), GBS, machine, 2)
    opt1, opt2 = one["breakdown"]["optimizer_ms"], two["breakdown"]["optimizer_ms"]
    assert two["step_ms"] - opt2 == pytest.approx((one["step_ms"] - opt1) / 2, rel=1e-4)


# ---- enumeration ------------------------------------------------------------------------------

def _rules_ok(lay, heads, layers, seq, gbs):
    """The trainer's layout rules, stated independently of config.validate (docs/training.md,
    docs/parallelism.md, docs/memory.md)."""
    tp, pp, vpp, dp, cp = lay.tp, lay.pp, lay.vpp, lay.dp, lay.cp
    if heads % tp or layers % (pp * vpp) or gbs % (lay.micro_batch_size * dp):
        return False
    if lay.sequence_parallel and (tp == 1 or (seq // cp) % tp):
        return False
    if cp > 1 and (seq % (2 * cp) or lay.zero >= 2):
        return False
    if lay.cp_comm == "a2a" and heads % (tp * cp):
        return False
    if lay.schedule == "zb" and lay.zero >= 2:
        return False
    m = gbs // (lay.micro_batch_size * dp)
    if lay.schedule == "interleaved" and (vpp < 2 or m < pp or m % pp):
        return False
    return True


def test_enumeration_is_exactly_the_valid_layouts():
    """layouts() yields every layout the rules allow and nothing else (4 ranks, 4 heads,
    4 layers, seq 32, global batch 8)."""
    cfg = cfg_of(*TINY)
    got = set(P.layouts(cfg, 4, GBS))
    want = set()
    for tp, cp, pp in itertools.product((1, 2, 4), repeat=3):
        if 4 % (tp * cp * pp):
            continue
        dp = 4 // (tp * cp * pp)
        for sched, vpp in ([("1f1b", 1)] if pp == 1 else
                           [("gpipe", 1), ("1f1b", 1), ("zb", 1), ("interleaved", 2),
                            ("interleaved", 3), ("interleaved", 4)]):
            for mb, zero, rec, sp, cpc in itertools.product(
                    (1, 2, 4, 8), (0, 1, 2, 3), ("none", "selective", "full"), (False, True),
                    ("ring", "a2a")):
                if (cp == 1 and cpc == "a2a") or (dp * cp == 1 and zero):
                    continue
                lay = Layout(tp, pp, vpp, dp, cp, 1, sp, mb, zero, rec, sched, cpc)
                if _rules_ok(lay, 4, 4, 32, GBS):
                    want.add(lay)
    assert got == want
    assert any(lay.pp == 2 and lay.schedule == "interleaved" for lay in got)


def test_trainer_accepts_every_proposed_layout():
    """Each proposed layout's flags, parsed by the train CLI at the planned world size, pass
    its validation (the planner never proposes what the trainer refuses)."""
    cfg = cfg_of(*TINY)
    machine = profile.Machine(toy_profile())
    rows = P.plan(cfg, 4, machine, GBS)
    assert rows == sorted(rows, key=lambda r: (r["step_ms"], r["peak_mem_bytes"]))
    for r in rows[::7]:
        C.parse_config(TINY + ["--synthetic-data", "--global-batch-size", str(GBS)] +
                       r["flags"].split(), world_size=4)


def test_memory_limit_drops_layouts():
    cfg = cfg_of(*TINY)
    machine = profile.Machine(toy_profile())
    rows = P.plan(cfg, 2, machine, GBS)
    cut = sorted(r["peak_mem_bytes"] for r in rows)[len(rows) // 2]
    kept = P.plan(cfg, 2, machine, GBS, mem_limit=cut)
    assert 0 < len(kept) < len(rows) and all(r["peak_mem_bytes"] <= cut for r in kept)
    with pytest.raises(P.PlanError, match="fits in 1000 bytes"):
        P.plan(cfg, 2, machine, GBS, mem_limit=1000)


def test_impossible_world_size_is_a_clear_error():
    """7 ranks: tp 7 splits no head of 4, pp 7 no 4 layers, dp 7 no batch of 8, cp 7 no
    sequence of 32: no layout."""
    cfg = cfg_of(*TINY)
    with pytest.raises(P.PlanError, match="no valid layout of this model on 7 ranks"):
        P.plan(cfg, 7, profile.Machine(toy_profile()), GBS)
    with pytest.raises(P.PlanError, match="--nproc must be >= 1"):
        P.plan(cfg, 0, profile.Machine(toy_profile()), GBS)


# ---- command lines ----------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tardelli.plan", *map(str, args)], env=ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_prints_ranked_json_lines_and_clear_errors(tmp_path):
    f = tmp_path / "toy.json"
    f.write_text(json.dumps(toy_profile()))
    p = _cli(*TINY, "--nproc", 2, "--global-batch-size", GBS, "--profile", f, "--json",
             "--top", 5)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(rows) == 5
    assert [r["step_ms"] for r in rows] == sorted(r["step_ms"] for r in rows)
    assert set(rows[0]) == {"flags", "step_ms", "peak_mem_bytes", "breakdown"}
    bad = copy.deepcopy(toy_profile())
    bad["bandwith"] = bad.pop("bandwidth")
    f.write_text(json.dumps(bad))
    p = _cli(*TINY, "--nproc", 2, "--profile", f, "--json")
    assert p.returncode == 2 and "unknown key 'bandwith'" in p.stderr
    f.write_text(json.dumps(toy_profile()))
    p = _cli(*TINY, "--nproc", 7, "--global-batch-size", GBS, "--profile", f)
    assert p.returncode == 2 and "no valid layout" in p.stderr
    p = _cli(*TINY, "--nproc", 2, "--profile", tmp_path / "missing.json")
    assert p.returncode == 2 and "no machine profile at" in p.stderr


def test_train_plan_auto_runs_the_planners_pick(tmp_path):
    """--plan auto on 2 ranks trains with the layout the planner ranks first."""
    f = tmp_path / "toy.json"
    f.write_text(json.dumps(toy_profile()))
    flags = TINY + ["--synthetic-data", "--global-batch-size", str(GBS), "--steps", "2",
                    "--eval-interval", "0", "--no-progress"]
    p = run(2, "tardelli.train", *flags, "--plan", "auto", "--plan-profile", f)
    chosen = [x for x in p.stdout.splitlines() if "--plan auto:" in x]
    assert len(chosen) == 1, p.stdout
    top = P.plan(cfg_of(*TINY), 2, profile.Machine(toy_profile()), GBS)[0]
    assert top["flags"] in chosen[0]
    summary = json.loads([x for x in p.stdout.splitlines() if "train_end" in x][-1])
    want = P._parse_flags(top["flags"], 2)
    assert (summary["tp"], summary["pp"], summary["dp"]) == (want.tp, want.pp, want.dp)
    bad = run(1, "tardelli.train", *flags, "--plan", "auto", "--plan-profile",
              tmp_path / "none.json", check=False)
    assert bad.returncode == 2 and "no machine profile" in bad.stderr


def test_megatron_table_predictions_are_finite():
    from tardelli.plan import megatron
    rows = megatron.table()
    assert len(rows) == len(megatron.ROWS)
    for r in rows:
        assert 0.05 < r["predicted_mfu"] < 0.95, r


def test_megatron_memory_accounting():
    """Note [Megatron's memory]: on a tiny GPT (hand arithmetic) the states are 2 + 4 + 12 / dp
    bytes per parameter of the first rank (its blocks and the tp-split embedding) and the
    activations 34 s h / tp per held layer and micro-batch (selective) or 2 s h / tp plus one
    rebuilt chunk (full); in the table only 175B on 96 GPUs needs full recomputation."""
    from tardelli.plan import megatron
    spec = ModelSpec("gpt2", 8, 64, 4, 4, 256, 32, 1000, "bf16")
    L, h, s, V = 8, 64, 32, 1000
    params = (spec.total_params() - V * h) / (2 * 2) + V * h / 2
    st, act = megatron.megatron_memory(spec, 16, 2, 2, 1, 32, "selective")   # dp 4, m 8
    assert st == pytest.approx(params * (2 + 4 + 12 / 4))
    assert act == pytest.approx(2 * (L // 2) * 34 * s * h / 2)   # min(m, pp) = 2 micro-batches
    _, full = megatron.megatron_memory(spec, 16, 2, 2, 2, 32, "full")      # interleaved, vpp 2
    held = min(8 * 2, (2 - 1) * 2 + (2 - 1) * 2 + 1) * (L // 4)
    assert full == pytest.approx(held * 2 * s * h / 2 + (L // 4) * 34 * s * h / 2)
    rows = {r["model"]: r for r in megatron.table()}
    for name, r in rows.items():
        assert r["megatron_memory_gb"] * 1e9 <= megatron.HBM_BYTES, r
        assert ("--recompute full" in r["flags"]) == (name == "175B @ 96 GPUs"), r


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q"]))
