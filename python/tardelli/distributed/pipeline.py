"""Pipeline-parallel schedules as data (a thin layer over tardelli._C.pipeline).

    from tardelli.distributed import pipeline as pp

    s = pp.make_schedule("zb", stages=4, microbatches=8)
    pp.validate(s)                       # raises TardelliError naming rank, action and rule
    s.actions[0][:3]                     # [('F', 0, 0), ('F', 1, 0), ('F', 2, 0)]
    r = pp.simulate(s)                   # F = BI = BW = 1 time unit; a full backward costs 2
    r.bubble_fraction, pp.bubble_formula("zb", 4, 8)
    pp.write_chrome_trace("zb.json", r.timeline)   # chrome://tracing or ui.perfetto.dev
    pp.plot_timeline("zb.png", r.timeline)         # needs matplotlib

An action is (kind, microbatch, chunk): kind "F" (forward), "B" (full backward), "I" (input-
gradient backward) or "W" (weight-gradient backward); chunk is the model chunk on the rank
(virtual stage chunk * stages + rank). A timeline is one list per rank of
(kind, microbatch, chunk, start, end) with times in seconds, either simulated or measured by the
runtime; chrome_trace, plot_timeline and bubble_fraction take both.

Command line: python -m tardelli.distributed.pipeline --schedule zb --pp 4 --microbatches 8
[--vpp 2] [--trace FILE.json] [--png FILE.png] prints the simulated bubble next to the formula.
"""
import argparse
import dataclasses
import json

from .. import _C

_P = _C.pipeline
Schedule = _P.Schedule
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
_COLORS = {"F": "#4caf50", "B": "#e53935", "I": "#1e88e5", "W": "#fdd835"}


@dataclasses.dataclass
class SimResult:
    makespan: float
    busy: list            # per rank: time spent computing
    bubble_fraction: float  # 1 - sum(busy) / (stages * makespan)
    peak_in_flight: list  # per rank: most (microbatch, chunk) activations held at once
    timeline: list        # per rank: [(kind, microbatch, chunk, start, end)]


def make_schedule(kind, stages, microbatches, chunks=1):
    """The action lists of schedule `kind` ("gpipe", "1f1b", "interleaved", "zb")."""
    return _P.make_schedule(kind, stages, microbatches, chunks)


def validate(schedule):
    """Raises TardelliError unless every rank's list is complete, ordered and deadlock-free."""
    _P.validate(schedule)


def simulate(schedule, t_forward=1.0, t_backward_input=1.0, t_backward_weight=1.0):
    """Times `schedule` with the given costs (a full backward costs BI + BW; each chunk pass of an
    interleaved schedule costs 1/chunks of it); communication is free."""
    return SimResult(**_P.simulate(schedule, t_forward, t_backward_input, t_backward_weight))


def bubble_formula(kind, stages, microbatches, chunks=1):
    """The textbook bubble fraction: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v*m+p-1) for
    interleaved, (p-1)/(3m+p-1) for zb (ZB-H1, equal F/BI/BW costs)."""
    return _P.bubble_formula(kind, stages, microbatches, chunks)


def dependencies(action, rank, stages, chunks=1):
    """[(event, microbatch, virtual stage, producing rank)] that `action` on `rank` waits for;
    event is "forward" or "input_grad". A producing rank other than `rank` means a receive."""
    return _P.dependencies(tuple(action), rank, stages, chunks)


def bubble_fraction(timeline):
    """1 - busy / (ranks * span) of a simulated or measured timeline (span: first start to last
    end over all ranks)."""
    events = [e for rank in timeline for e in rank]
    if not events:
        return 0.0
    t0 = min(e[3] for e in events)
    span = max(e[4] for e in events) - t0
    busy = sum(e[4] - e[3] for e in events)
    return 1.0 - busy / (len(timeline) * span) if span > 0 else 0.0


def chrome_trace(timeline, indent=None):
    """The Chrome trace JSON text of `timeline` (one "X" event per action, pid = rank)."""
    return _P.chrome_trace(_normalize(timeline), -1 if indent is None else indent)


def write_chrome_trace(path, timeline):
    text = chrome_trace(timeline)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_timeline(path, timeline, title=None):
    """Writes a PNG Gantt chart of `timeline` (one row per rank). Raises RuntimeError when
    matplotlib is not installed."""
    if not have_matplotlib():
        raise RuntimeError("plot_timeline: matplotlib is not installed (pip install matplotlib); "
                           "write_chrome_trace needs nothing")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timeline = _normalize(timeline)
    ranks = len(timeline)
    end = max((e[4] for rank in timeline for e in rank), default=1.0)
    chunked = any(e[2] for rank in timeline for e in rank)
    fig, ax = plt.subplots(figsize=(min(40.0, 3.0 + 0.35 * sum(map(len, timeline)) / max(ranks, 1)),
                                    0.6 * ranks + 1.2))
    for r, rank in enumerate(timeline):
        for kind, mb, chunk, start, stop in rank:
            ax.barh(r, stop - start, left=start, height=0.8, color=_COLORS[kind],
                    edgecolor="black", linewidth=0.4)
            label = f"{mb}" + (f".{chunk}" if chunked else "")
            ax.text(start + (stop - start) / 2, r, label, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, end)
    ax.set_xlabel("time")
    used = sorted({e[0] for rank in timeline for e in rank}, key="FBIW".index)
    ax.legend(handles=[Patch(color=_COLORS[k], label=KIND_NAMES[k]) for k in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(used), fontsize=7)
    ax.set_title(title or f"bubble {bubble_fraction(timeline):.3f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _normalize(timeline):
    """Per rank: [(kind, microbatch, chunk, start, end)] from any sequences of that shape."""
    return [[(str(e[0]), int(e[1]), int(e[2]), float(e[3]), float(e[4])) for e in rank]
            for rank in timeline]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Simulate a pipeline schedule")
    ap.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    ap.add_argument("--pp", type=int, default=4, help="pipeline stages")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--vpp", type=int, default=None, help="model chunks per rank (interleaved)")
    ap.add_argument("--trace", help="write a Chrome trace JSON here")
    ap.add_argument("--png", help="write a PNG chart here (needs matplotlib)")
    a = ap.parse_args(argv)
    v = a.vpp or (2 if a.schedule == "interleaved" else 1)
    s = make_schedule(a.schedule, a.pp, a.microbatches, v)
    validate(s)
    r = simulate(s)
    print(json.dumps({"schedule": a.schedule, "pp": a.pp, "microbatches": a.microbatches,
                      "vpp": v, "bubble": r.bubble_fraction,
                      "formula": bubble_formula(a.schedule, a.pp, a.microbatches, v),
                      "peak_in_flight": r.peak_in_flight}))
    if a.trace:
        write_chrome_trace(a.trace, r.timeline)
    if a.png:
        plot_timeline(a.png, r.timeline, f"{a.schedule} p={a.pp} m={a.microbatches} v={v}: "
                                         f"bubble {r.bubble_fraction:.3f}")


__all__ = [
    "SCHEDULES", "Schedule", "SimResult", "bubble_formula", "bubble_fraction", "chrome_trace",
    "dependencies", "have_matplotlib", "make_schedule", "plot_timeline", "simulate", "validate",
    "write_chrome_trace",
]

if __name__ == "__main__":
    main()
