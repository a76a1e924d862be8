"""tardelli.distributed.pipeline: the schedule layer through the binding (round trip, errors,
simulation numbers, Chrome trace and PNG)."""
import json

import pytest

from tardelli import _C
from tardelli.distributed import pipeline as pp


# Property: the bound schedule exposes its lists as (kind, microbatch, chunk) tuples, and a
# Schedule rebuilt from those tuples validates and simulates identically (a lossless round trip).
@pytest.mark.parametrize("kind,p,m,v", [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1),
                                        ("interleaved", 2, 4, 2), ("zb", 4, 6, 1)])
def test_round_trip(kind, p, m, v):
    s = pp.make_schedule(kind, p, m, v)
    assert (s.kind, s.stages, s.microbatches, s.chunks) == (kind, p, m, v)
    assert len(s.actions) == p
    assert all(isinstance(a, tuple) and a[0] in "FBIW" for rank in s.actions for a in rank)
    pp.validate(s)
    t = pp.Schedule(kind, p, m, v, s.actions)
    assert t.actions == s.actions
    a, b = pp.simulate(s), pp.simulate(t)
    assert a == b
    assert a.timeline[0][0][:3] == s.actions[0][0]


# Property: the 1F1B first rank's order is Megatron's (p-1 warm-up forwards, then F/B pairs).
def test_one_f_one_b_order():
    s = pp.make_schedule("1f1b", 4, 6)
    assert s.actions[0][:6] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0),
                                ("B", 0, 0), ("F", 4, 0)]


# Property: simulated bubbles match the formulas exactly at p=4, m=8 (F = BI = BW = 1; integer
# or 1/v multiples, so 1e-9 is generous), and 1F1B holds min(p - r, m) micro-batches on rank r.
def test_simulated_bubble_and_peak():
    for kind, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)]:
        r = pp.simulate(pp.make_schedule(kind, 4, 8, v))
        assert r.bubble_fraction == pytest.approx(pp.bubble_formula(kind, 4, 8, v), abs=1e-9)
        assert pp.bubble_fraction(r.timeline) == pytest.approx(r.bubble_fraction, abs=1e-12)
    assert pp.simulate(pp.make_schedule("1f1b", 4, 8)).peak_in_flight == [4, 3, 2, 1]
    assert pp.simulate(pp.make_schedule("zb", 4, 8)).peak_in_flight == [4, 3, 2, 1]
    assert pp.bubble_formula("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert pp.bubble_formula("zb", 4, 8) == pytest.approx(3 / 27)


# Property: errors surface as TardelliError with the C++ text (rank and rule for validate).
def test_errors():
    with pytest.raises(_C.TardelliError, match="3 micro-batches < 4 pipeline stages"):
        pp.make_schedule("interleaved", 4, 3, 2)
    with pytest.raises(_C.TardelliError, match="valid schedules: gpipe, 1f1b, interleaved, zb"):
        pp.make_schedule("pipedream", 2, 2)
    s = pp.make_schedule("1f1b", 2, 2)
    broken = [list(s.actions[0]), [("B", 0, 0)] + list(s.actions[1])[1:]]
    with pytest.raises(_C.TardelliError, match="rank 1 action 0 \\(B0c0\\).*before the forward"):
        pp.validate(pp.Schedule("1f1b", 2, 2, 1, broken))
    with pytest.raises(_C.TardelliError, match="unknown action kind 'X'"):
        pp.Schedule("1f1b", 1, 1, 1, [[("X", 0, 0)]])


# Property: the Chrome trace loads with json.loads and has one "X" event per action (p * actions
# per rank), pid = rank, microsecond times and the micro-batch in args.
def test_chrome_trace(tmp_path):
    s = pp.make_schedule("zb", 3, 4)
    r = pp.simulate(s, 0.5, 0.25, 0.25)
    trace = json.loads(pp.chrome_trace(r.timeline))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 3 * len(s.actions[0])
    first = xs[0]
    assert first["pid"] == 0 and first["name"] == "F0"
    assert first["ts"] == 0 and first["dur"] == pytest.approx(0.5e6)
    assert first["args"] == {"microbatch": 0, "chunk": 0, "kind": "forward"}
    assert {e["pid"] for e in xs} == {0, 1, 2}
    path = pp.write_chrome_trace(str(tmp_path / "t.json"), r.timeline)
    with open(path) as f:
        assert len([e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]) == len(xs)


# Property: dependencies cross the binding: an interleaved chunk-1 forward on rank 0 receives
# from the last rank's chunk 0.
def test_dependencies():
    assert pp.dependencies(("F", 2, 1), 0, 4, 2) == [("forward", 2, 3, 3)]
    assert pp.dependencies(("W", 2, 0), 1, 4) == [("input_grad", 2, 1, 1)]


# Property: the PNG chart is written (a valid PNG signature) when matplotlib is importable;
# otherwise plot_timeline says so.
def test_plot(tmp_path):
    r = pp.simulate(pp.make_schedule("interleaved", 2, 4, 2))
    path = str(tmp_path / "t.png")
    if not pp.have_matplotlib():
        with pytest.raises(RuntimeError, match="matplotlib is not installed"):
            pp.plot_timeline(path, r.timeline)
        return
    pp.plot_timeline(path, r.timeline)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
