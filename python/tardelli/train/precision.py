"""The trainer's side of the block linears' precision (docs/fp8.md): FP8 scalings (--fp8) and
the per-layer precision policy (--precision-policy, --precision-map).

The logic is C++ (include/tardelli/models/precision_policy.h, block_linears.h, parallel/
precision_sync.h); this module builds it from the configuration, runs its once-per-step
agreement over the ranks holding the same layers (the tp x cp x dp group: Note [Amax
reduction]), reports it in the metrics and saves and restores it with each rank's RNG file."""
import json
import tomllib

import tardelli as td

from .. import _C
from . import config as C

_CODES = {"default": 0, "fp8": 1, "bf16": 2, "fp32": 3}
_NAMES = {v: k for k, v in _CODES.items()}


def _flatten(table, prefix=""):
    """{"h": {"3": {"mlp": {"c_fc": "bf16"}}}} -> {"h.3.mlp.c_fc": "bf16"}: TOML reads dotted
    keys as nested tables, JSON may hold either form."""
    out = {}
    for k, v in table.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def read_precision_map(path, n_layer):
    """The --precision-map file (JSON, or TOML by its .toml suffix) as {linear name: precision},
    checked against a model of n_layer blocks; ConfigError naming the file and the entry."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        table = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (OSError, ValueError) as e:
        raise C.ConfigError(f"--precision-map {path}: {e}") from None
    if not isinstance(table, dict):
        raise C.ConfigError(f"--precision-map {path}: expected a table of linear names to "
                            f"precisions, got {type(table).__name__}")
    entries = _flatten(table)
    for k, v in entries.items():
        if not isinstance(v, str):
            raise C.ConfigError(f"--precision-map {path}: entry '{k}': expected a precision "
                                f"string (fp8, bf16 or fp32), got {v!r}")
    try:
        return _C.models.parse_precision_map(entries, n_layer)
    except Exception as e:  # td::Error: names the entry
        raise C.ConfigError(f"--precision-map {path}: {e}") from None


def _policy_options(cfg):
    return dict(fp8_overflow=cfg.precision_fp8_overflow,
                fp8_underflow=cfg.precision_fp8_underflow,
                fp8_error=cfg.precision_fp8_error, bf16_error=cfg.precision_bf16_error,
                stable_steps=cfg.precision_stable_steps)


class Precision:
    """Every chunk's block-linear precision on this rank. `group`: the ranks holding the same
    layers (None: one rank); `pp_group`: to report every stage's linears (None without pp)."""

    def __init__(self, cfg, chunks, group, pp_group):
        self.chunks, self.group, self.pp_group = chunks, group, pp_group
        self.adaptive = cfg.precision_policy == "adaptive"
        self.report = self.adaptive or bool(cfg.precision_map)
        self.n_layer = cfg.layers
        pmap = read_precision_map(cfg.precision_map, cfg.layers) if cfg.precision_map else {}
        lowest = "fp8" if cfg.fp8 != "none" else "bf16"
        for ch in chunks:
            if cfg.fp8 != "none":
                ch._cpp.set_fp8(cfg.fp8_amax_history, cfg.fp8_margin, cfg.fp8)
            names = ch._cpp.linear_names()
            policy = None
            if self.adaptive:
                # Note [Adaptive precision]: a map entry is that linear's floor.
                policy = _C.models.PrecisionPolicy(names, [pmap.get(n, lowest) for n in names],
                                                   **_policy_options(cfg))
                ch._cpp.linear_precisions = policy.precisions
                ch._cpp.precision_monitor = True
            elif pmap:
                ch._cpp.linear_precisions = [pmap.get(n, "default") for n in names]
            object.__setattr__(ch, "_precision_policy", policy)
        self.codes = None  # the precisions reported last (set at the first step: after a resume)

    def _global_codes(self):
        """Every linear's precision code over the whole model (all pipeline stages)."""
        codes = [0] * (4 * self.n_layer)
        for ch in self.chunks:
            first = 4 * ch.stage[0]
            for i, p in enumerate(ch._cpp.linear_precisions):
                codes[first + i] = _CODES[p]
        if self.pp_group is not None and self.report:
            t = td.tensor(codes, dtype=td.int64)
            self.pp_group.all_reduce(t, "max")
            codes = [int(x) for x in t.tolist()]
        return codes

    def step(self):
        """The end of a training step (collective over the group, and over pp when
        reporting): amaxes reduced and committed, the policy's decisions applied. Returns the
        metrics' `precision` field (None when there is nothing to report)."""
        if self.report and self.codes is None:
            self.codes = self._global_codes()
        for ch in self.chunks:
            _C.parallel.precision_step(ch._cpp, ch._precision_policy, self.group)
        if not self.report:
            return None
        codes = self._global_codes()
        names = _C.models.block_linear_names(0, self.n_layer)
        rec = {p: sum(1 for c in codes if _NAMES[c] == p) for p in ("fp8", "bf16", "fp32")}
        changes = [f"{names[i]}:{_NAMES[a]}->{_NAMES[b]}"
                   for i, (a, b) in enumerate(zip(self.codes, codes)) if a != b]
        if changes:
            rec["changes"] = changes
        self.codes = codes
        return rec

    def replicated(self, world):
        """Whether every rank reports the same precisions for the whole model (a collective
        over `world`: the codes max- and min-reduced)."""
        if world is None or world.size == 1 or not self.codes:
            return True
        hi, lo = td.tensor(self.codes, dtype=td.int64), td.tensor(self.codes, dtype=td.int64)
        world.all_reduce(hi, "max")
        world.all_reduce(lo, "min")
        return hi.tolist() == lo.tolist()


def chunk_state(ch):
    """What a checkpoint keeps of one chunk's block linears: its linears' names, FP8 scalings
    and the policy's per-linear state (identical on every rank holding the chunk's layers)."""
    out = {"linears": ch._cpp.linear_names()}
    if ch._cpp.fp8:
        out["fp8"] = ch._cpp.fp8_state()
    policy = getattr(ch, "_precision_policy", None)
    if policy is not None:
        out["precision"] = {"precisions": policy.precisions, "stable": policy.stable_counts}
    return out


def load_chunk_state(ch, saved_chunks):
    """Restores `ch`'s block linears from saved chunk states (each one rank's chunk, any
    layout): each linear takes the first saved entry of its name. The scalings and decisions are
    identical on every rank holding a layer (Note [Amax reduction]), so any rank's copy is
    right at any data- or tensor-parallel degree; another pipeline split finds each layer in
    the file of the stage that held it."""
    names = ch._cpp.linear_names()
    fp8, prec = {}, {}
    for c in saved_chunks:
        linears = c.get("linears")
        if linears is None:
            continue
        for i, n in enumerate(linears):
            if c.get("fp8") is not None:
                fp8.setdefault(n, c["fp8"][i])
            if c.get("precision") is not None:
                prec.setdefault(n, (c["precision"]["precisions"][i],
                                    c["precision"]["stable"][i]))
    if ch._cpp.fp8 and all(n in fp8 for n in names):
        ch._cpp.load_fp8_state([fp8[n] for n in names])
    policy = getattr(ch, "_precision_policy", None)
    if policy is not None and all(n in prec for n in names):
        for n in names:
            p, stable = prec[n]
            policy.set_state(n, p, stable)
        ch._cpp.linear_precisions = policy.precisions


def saved_chunks_of(reader, world_size, rng_file):
    """Every saved rank's chunk states (from its RNG file), for a resume at another layout."""
    out = []
    for r in range(world_size):
        if reader.has_file(rng_file(r)):
            out += json.loads(reader.read_bytes(rng_file(r))).get("chunks", [])
    return out


def active(cfg):
    """Whether the block linears have any precision state to agree on across ranks."""
    return cfg.fp8 != "none" or cfg.precision_policy == "adaptive" or bool(cfg.precision_map)


def precision_group(grid, cfg):
    """The ranks holding the same layers as this one: tp x cp x dp (None: one rank, or nothing
    to agree on)."""
    return grid.group("tp-cp-dp") if grid is not None and active(cfg) else None


