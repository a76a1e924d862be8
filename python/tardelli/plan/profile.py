"""A machine profile: what one rank's device computes and moves per second, measured by
`python -m tardelli.plan calibrate` or written by hand for a cluster that is not here.

Format (JSON, docs/planner.md "The profile"): every key is known; an unknown key, a missing
key or a value of the wrong type is a ProfileError naming its path, so a typo in a hand-written
profile never silently falls back to a default.

    {"version": 1, "name": "...", "hardware": "...",
     "cores": 2,                     # CPU cores the ranks share (0: one device per rank)
     "ranks_per_node": 8,            # collectives inside a node use "collectives", beyond it
                                     # "inter_node" (0: every rank on one node)
     "gemm": [{"dtype": "fp32", "threads": 1, "m": 512, "n": 512, "k": 512,
               "flops": 6.1e10}, ...],
     "attention": [{"dtype": "fp32", "threads": 1, "seq": 256, "head_dim": 64,
                    "flops": 3.0e10}, ...],        # fwd+bwd FLOP/s of causal attention
     "bandwidth": [{"threads": 1, "bytes_per_s": 1.2e10}, ...],   # memory-bound ops
     "probes": [{"arch": "gpt2", "threads": 1, "d": 256, "heads": 4, "seq": 128,
                 "batch": 4, "vocab": 4096, "block_s": 0.05, "head_s": 0.04}],
                                     # optional: one real block and LM head, timed (cost.py
                                     # Note [Elementwise probes])
     "op_overhead_s": 4e-6,          # fixed cost of one op call (dispatch, Python)
     "block_overhead_s": {"gpt2": 3e-4, "llama": 3e-4},  # fixed cost of one block's forward
                                     # + backward besides its FLOPs and bytes
     "step_overhead_s": {"1": 2e-3, "2": 3e-3},   # per step, by world size (logging, metrics)
     "collectives": {"all_reduce": {"2": {"alpha_s": 2e-5, "beta_s_per_byte": 1e-10,
                     # optional second regime from split_bytes up (eager vs rendezvous):
                     "split_bytes": 262144, "alpha_large_s": 1e-4,
                     "beta_large_s_per_byte": 6e-10}}, ...},
     "inter_node": {...same shape as collectives...},
     "overlap": 0.8,                 # fraction of an async collective hidden behind compute
     "shared_core_sync_s": 3e-4,     # optional: extra seconds of a sub-group's blocking
                                     # collective when ranks outnumber the cores (calibrate.py
                                     # Note [Shared-core syncs]; 0 when absent)
     "allocator": "td_cpu",          # td_cpu: size classes of src/core/allocator.cpp;
                                     # cuda_caching: 512-byte rounding, plus "slack"
     "memory_slack": 0.0,            # fraction added to predicted peaks (fragmentation)
     "memory_bytes": 2.4e10,         # device memory per rank (the default --mem-limit)
     "tp_comm_overlap": 0.0,         # optional: fraction of tp/sp collectives hidden behind
                                     # GEMMs (Megatron's --tp-comm-overlap; Tardelli: 0)
     "dp_overlap_with_pp": false,    # optional: the dp reduction overlaps the pipeline's
                                     # cooldown (Megatron; Tardelli reduces after the schedule)
     "param_gather_bytes": 4}        # optional: bytes per parameter of ZeRO's parameter
                                     # all-gather (Tardelli gathers fp32 masters: 4; Megatron's
                                     # distributed optimizer the bf16 model parameters: 2)
"""
import json
import math

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DTYPES = ("fp32", "bf16", "fp16")


class ProfileError(ValueError):
    """A profile that is not valid; the message names the key path and what was wrong."""


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_obj(obj, where, required, optional=()):
    if not isinstance(obj, dict):
        raise ProfileError(f"{where}: expected an object, got {type(obj).__name__}")
    known = set(required) | set(optional)
    for k in obj:
        if k not in known:
            raise ProfileError(f"{where}: unknown key '{k}' (known: {', '.join(sorted(known))})")
    for k in required:
        if k not in obj:
            raise ProfileError(f"{where}: missing key '{k}'")


def _positive(obj, key, where, allow_zero=False):
    v = obj[key]
    if not _num(v) or v < 0 or (v == 0 and not allow_zero):
        raise ProfileError(f"{where}.{key}: expected a {'non-negative' if allow_zero else 'positive'}"
                           f" number, got {v!r}")


def _check_rows(rows, where, keys):
    if not isinstance(rows, list) or not rows:
        raise ProfileError(f"{where}: expected a non-empty list of measurements")
    for i, r in enumerate(rows):
        w = f"{where}[{i}]"
        _check_obj(r, w, keys)
        for k in keys:
            if k == "dtype":
                if r[k] not in DTYPES:
                    raise ProfileError(f"{w}.dtype: expected one of {', '.join(DTYPES)}, "
                                       f"got {r[k]!r}")
            else:
                _positive(r, k, w)


def _check_collectives(obj, where):
    _check_obj(obj, where, (), COLLECTIVES)
    for op, by_size in obj.items():
        if not isinstance(by_size, dict) or not by_size:
            raise ProfileError(f"{where}.{op}: expected an object keyed by group size")
        for g, fit in by_size.items():
            if not g.isdigit() or int(g) < 2:
                raise ProfileError(f"{where}.{op}: group size keys are integers >= 2, got {g!r}")
            w = f"{where}.{op}.{g}"
            _check_obj(fit, w, ("alpha_s", "beta_s_per_byte"),
                       ("split_bytes", "alpha_large_s", "beta_large_s_per_byte"))
            for k in fit:
                _positive(fit, k, w, allow_zero=True)
            large = {"split_bytes", "alpha_large_s", "beta_large_s_per_byte"}
            if large & set(fit) and not large <= set(fit):
                raise ProfileError(f"{w}: a second regime needs all of "
                                   f"{', '.join(sorted(large))}")


def validate(p):
    """Raises ProfileError unless `p` (a dict) is a complete, well-typed profile."""
    _check_obj(p, "profile", ("version", "name", "cores", "gemm", "attention", "bandwidth",
                              "op_overhead_s", "block_overhead_s", "step_overhead_s",
                              "collectives", "overlap",
                              "allocator", "memory_bytes"),
               ("hardware", "ranks_per_node", "inter_node", "memory_slack", "measured",
                "notes", "tp_comm_overlap", "dp_overlap_with_pp", "probes",
                "param_gather_bytes", "shared_core_sync_s"))
    if p["version"] != 1:
        raise ProfileError(f"profile.version: expected 1, got {p['version']!r}")
    if not isinstance(p["name"], str):
        raise ProfileError("profile.name: expected a string")
    c = p["cores"]
    if not isinstance(c, int) or isinstance(c, bool) or c < 0:
        raise ProfileError(f"profile.cores: expected an integer >= 0, got {c!r}")
    rpn = p.get("ranks_per_node", 0)
    if not isinstance(rpn, int) or isinstance(rpn, bool) or rpn < 0:
        raise ProfileError(f"profile.ranks_per_node: expected an integer >= 0, got {rpn!r}")
    if rpn and "inter_node" not in p:
        raise ProfileError("profile.ranks_per_node is set: give 'inter_node' collectives too")
    _check_rows(p["gemm"], "profile.gemm", ("dtype", "threads", "m", "n", "k", "flops"))
    _check_rows(p["attention"], "profile.attention",
                ("dtype", "threads", "seq", "head_dim", "flops"))
    _check_rows(p["bandwidth"], "profile.bandwidth", ("threads", "bytes_per_s"))
    if "probes" in p:
        if not isinstance(p["probes"], list):
            raise ProfileError("profile.probes: expected a list")
        for i, r in enumerate(p["probes"]):
            w = f"profile.probes[{i}]"
            _check_obj(r, w, ("arch", "threads", "d", "heads", "seq", "batch", "vocab",
                              "block_s", "head_s"))
            if r["arch"] not in ("gpt2", "llama"):
                raise ProfileError(f"{w}.arch: expected gpt2 or llama, got {r['arch']!r}")
            for k in ("threads", "d", "heads", "seq", "batch", "vocab"):
                _positive(r, k, w)
            for k in ("block_s", "head_s"):
                _positive(r, k, w, allow_zero=True)
    _positive(p, "op_overhead_s", "profile", allow_zero=True)
    _check_obj(p["block_overhead_s"], "profile.block_overhead_s", ("gpt2", "llama"))
    for a in ("gpt2", "llama"):
        _positive(p["block_overhead_s"], a, "profile.block_overhead_s", allow_zero=True)
    so = p["step_overhead_s"]
    if not isinstance(so, dict) or not so:
        raise ProfileError("profile.step_overhead_s: expected an object keyed by world size")
    for k, v in so.items():
        if not k.isdigit() or not _num(v) or v < 0:
            raise ProfileError(f"profile.step_overhead_s.{k}: expected a world size key and "
                               f"seconds >= 0, got {v!r}")
    _check_collectives(p["collectives"], "profile.collectives")
    if "inter_node" in p:
        _check_collectives(p["inter_node"], "profile.inter_node")
    if not _num(p["overlap"]) or not 0 <= p["overlap"] <= 1:
        raise ProfileError(f"profile.overlap: expected a fraction in [0, 1], got {p['overlap']!r}")
    if not _num(p.get("tp_comm_overlap", 0)) or not 0 <= p.get("tp_comm_overlap", 0) <= 1:
        raise ProfileError(f"profile.tp_comm_overlap: expected a fraction in [0, 1], got "
                           f"{p['tp_comm_overlap']!r}")
    if not _num(p.get("shared_core_sync_s", 0)) or p.get("shared_core_sync_s", 0) < 0:
        raise ProfileError(f"profile.shared_core_sync_s: expected seconds >= 0, got "
                           f"{p['shared_core_sync_s']!r}")
    if p.get("param_gather_bytes", 4) not in (2, 4):
        raise ProfileError(f"profile.param_gather_bytes: expected 2 or 4, got "
                           f"{p['param_gather_bytes']!r}")
    if not isinstance(p.get("dp_overlap_with_pp", False), bool):
        raise ProfileError("profile.dp_overlap_with_pp: expected true or false")
    if p["allocator"] not in ("td_cpu", "cuda_caching"):
        raise ProfileError(f"profile.allocator: expected td_cpu or cuda_caching, got "
                           f"{p['allocator']!r}")
    _positive(p, "memory_bytes", "profile")
    if "memory_slack" in p:
        _positive(p, "memory_slack", "profile", allow_zero=True)
    return p


def load(path):
    """The validated profile stored at `path` (ProfileError if missing or invalid)."""
    try:
        with open(path, encoding="utf-8") as f:
            p = json.load(f)
    except FileNotFoundError:
        raise ProfileError(f"--profile: file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"--profile {path}: not valid JSON: {e}") from None
    try:
        return validate(p)
    except ProfileError as e:
        raise ProfileError(f"--profile {path}: {e}") from None


def save(p, path):
    validate(p)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(p, f, indent=1, sort_keys=True)
        f.write("\n")


class Machine:
    """Lookups into a validated profile: time of a GEMM, of attention, of a memory-bound pass,
    of a collective, for a rank that runs `threads` OpenMP threads."""

    def __init__(self, p):
        self.p = validate(p)
        self.cores = p["cores"]
        self._gemm_cache = {}

    def threads(self, nproc):
        """OpenMP threads per rank, as tardelli.launch sets them (cores // nproc, at least 1)."""
        return max(1, self.cores // nproc) if self.cores else 1

    def contention(self, nproc):
        """How many times slower a rank computes because ranks share cores: ranks x threads over
        cores (1 with a device per rank)."""
        if not self.cores:
            return 1.0
        return max(1.0, nproc * self.threads(nproc) / self.cores)

    @staticmethod
    def _nearest_threads(rows, threads):
        have = sorted({r["threads"] for r in rows})
        return min(have, key=lambda t: (abs(t - threads), -t))

    def gemm_seconds(self, m, n, k, dtype, threads=1):
        """Seconds of one [m, k] x [k, n] GEMM: 2mnk over the rate blended from the two measured
        shapes nearest in log space (same dtype, or fp32 when the dtype was not measured)."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        key = (m, n, k, dtype, threads)
        hit = self._gemm_cache.get(key)
        if hit is not None:
            return hit
        rows = [r for r in self.p["gemm"] if r["dtype"] == dtype] or \
            [r for r in self.p["gemm"] if r["dtype"] == "fp32"] or self.p["gemm"]
        t = self._nearest_threads(rows, threads)
        lm, ln, lk = math.log(m), math.log(n), math.log(k)
        scored = sorted((abs(math.log(r["m"]) - lm) + abs(math.log(r["n"]) - ln) +
                         abs(math.log(r["k"]) - lk), i, r)
                        for i, r in enumerate(rows) if r["threads"] == t)[:2]
        # Inverse-distance blend of the two nearest shapes' rates (an exact match wins).
        w = [1.0 / max(dist, 1e-6) for dist, _, _ in scored]
        rate = sum(wi * r["flops"] for wi, (_, _, r) in zip(w, scored)) / sum(w)
        self._gemm_cache[key] = out = 2.0 * m * n * k / rate
        return out

    def attention_seconds(self, flops, seq, head_dim, dtype, threads=1):
        """Seconds of causal attention forward + backward doing `flops` (model FLOPs)."""
        if flops <= 0:
            return 0.0
        rows = [r for r in self.p["attention"] if r["dtype"] == dtype] or self.p["attention"]
        t = self._nearest_threads(rows, threads)
        rows = [r for r in rows if r["threads"] == t]
        r = min(rows, key=lambda r: abs(math.log(r["seq"] / seq)) +
                abs(math.log(r["head_dim"] / head_dim)))
        return flops / r["flops"]

    def memory_seconds(self, nbytes, threads=1):
        rows = self.p["bandwidth"]
        t = self._nearest_threads(rows, threads)
        bw = max(r["bytes_per_s"] for r in rows if r["threads"] == t)
        return nbytes / bw

    def block_overhead(self, arch):
        return self.p["block_overhead_s"][arch]

    def op_seconds(self, ops):
        return ops * self.p["op_overhead_s"]

    def step_overhead(self, nproc):
        """The per-step overhead at `nproc` ranks: linear in log2(world) between measured world
        sizes, the nearest measured one outside them (no extrapolation)."""
        so = {int(k): v for k, v in self.p["step_overhead_s"].items()}
        ks = sorted(so)
        if nproc <= ks[0]:
            return so[ks[0]]
        if nproc >= ks[-1]:
            return so[ks[-1]]
        for a, b in zip(ks, ks[1:]):
            if a <= nproc <= b:
                f = (math.log2(nproc) - math.log2(a)) / (math.log2(b) - math.log2(a))
                return so[a] + f * (so[b] - so[a])
        return so[ks[-1]]

    def collective_seconds(self, op, nbytes, group, span_nodes=False):
        """alpha + beta x bytes of `op` over `group` ranks (bytes: nccl-tests' convention, the
        whole buffer). A group size that was not measured uses the nearest one, with beta scaled
        by the ring's (g-1)/g factor and alpha by the number of ring steps."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        table = self.p["inter_node"] if span_nodes and "inter_node" in self.p else \
            self.p["collectives"]
        fits = table.get(op) or table.get("all_reduce")
        if fits is None:
            raise ProfileError(f"profile has no fit for collective '{op}'")
        sizes = sorted(int(g) for g in fits)
        g0 = min(sizes, key=lambda g: (abs(math.log(g / group)), g))
        fit = fits[str(g0)]
        # Two regimes where the fit has them (MPI's eager and rendezvous protocols on a CPU).
        if "split_bytes" in fit and nbytes >= fit["split_bytes"]:
            alpha, beta = fit["alpha_large_s"], fit["beta_large_s_per_byte"]
        else:
            alpha, beta = fit["alpha_s"], fit["beta_s_per_byte"]
        if g0 == group or op == "send_recv":
            return alpha + beta * nbytes
        ring = ((group - 1) / group) / ((g0 - 1) / g0)
        return alpha * (group - 1) / (g0 - 1) + beta * nbytes * ring
