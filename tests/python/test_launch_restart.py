"""Supervised restarts, `python -m tardelli.launch --max-restarts N [--heartbeat-timeout S]`
(python/tardelli/distributed/supervisor.py, docs/distributed.md "Supervised restarts").

The decision logic (which rank failed, how, whether to restart) and the restart loop are tested
without MPI on plain Python programs; the rest runs python -m tardelli.train on 2 ranks with a
fault injected by TD_TEST_FAULT (a rank SIGKILLs or SIGSTOPs itself at a given step of attempt
0, so every run is deterministic) and compares the losses with a fault-free run."""
import json
import os
import signal
import subprocess
import sys

import pytest

import tardelli as td
from tardelli.distributed import launch, supervisor
from tardelli.train import report

from cli_runner import ENV, ROOT

# Tiny model (tests/python/test_train_moe.py's sizes, dense): 6 steps of 8 samples, 2 ranks x 4;
# checkpoints every 2 steps, so a fault at step 3 resumes from step 2 and repeats step 3.
BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "16", "--micro-batch-size", "4", "--global-batch-size", "8",
        "--steps", "6", "--warmup-steps", "1", "--lr", "3e-3", "--no-progress",
        "--eval-interval", "0", "--log-interval", "1", "--ddp-bucket-mb", "0.05"]

needs_mpi = pytest.mark.skipif(
    not td.distributed.mpi_available() or launch.shutil.which("mpirun") is None,
    reason="this build has no MPI backend or mpirun is missing")


def launch_train(launcher_args, train_args, fault="", timeout=120):
    """python -m tardelli.launch --nproc 2 LAUNCHER_ARGS -m tardelli.train BASE TRAIN_ARGS."""
    env = dict(ENV, TD_TEST_FAULT=fault)
    cmd = [sys.executable, "-m", "tardelli.launch", "--nproc", "2", "--timeout", "60",
           "--max-time", str(timeout - 20), *launcher_args, "-m", "tardelli.train", *BASE,
           *map(str, train_args)]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def effective_losses(path):
    return [r["loss"] for r in report.effective_rows(report.read_metrics(path))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The fault-free run's per-step losses (same layout, unsupervised)."""
    m = tmp_path_factory.mktemp("ref") / "m.jsonl"
    p = launch_train([], ["--metrics-file", m])
    assert p.returncode == 0, p.stderr
    rows = report.read_metrics(m)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    return [r["loss"] for r in rows]


# ---- end to end: tardelli.train on 2 ranks ----

@needs_mpi
def test_killed_rank_restarts_and_repeats_losses(reference, tmp_path):
    # Property: rank 1 SIGKILLed after step 3 of attempt 0 makes the launcher log the cause
    # (rank, signal) and the attempt, restart the whole job, which resumes from the step-2
    # checkpoint and ends with status 0; the last row of each step gives the fault-free losses
    # bitwise (Note [Exact resume]), and the metrics file keeps attempt 0's step 3 and the
    # restart event between the attempts.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    p = launch_train(["--max-restarts", "2", "--heartbeat-timeout", "30"],
                     ["--save", save, "--save-interval", "2", "--resume", "--metrics-file", m],
                     fault="attempt0:rank1:step3:kill")
    assert p.returncode == 0, p.stderr
    assert "tardelli.launch: attempt 0 failed: rank 1 (pid " in p.stderr
    assert "was killed by signal 9 (SIGKILL); restarting the whole job (attempt 1, restart 1 " \
           "of 2)" in p.stderr
    assert "resumed from" in p.stdout and "at step 2" in p.stdout
    assert effective_losses(m) == reference
    rows = report.read_metrics(m)
    assert [r.get("event", r["step"]) for r in rows] == [1, 2, 3, "restart", 3, 4, 5, 6]
    event = rows[3]
    assert event["attempt"] == 1 and event["step"] == 2
    assert event["cause"].startswith("rank 1 (pid ") and "signal 9" in event["cause"]
    assert rows[2]["loss"] == rows[4]["loss"]  # the repeated step 3


@needs_mpi
def test_stopped_rank_is_a_hang_and_restarts(reference, tmp_path):
    # Property: rank 1 SIGSTOPped at step 3 of attempt 0 (before that step's heartbeat) stops
    # beating while rank 0 waits for it in a collective; after --heartbeat-timeout 4 s the
    # launcher reports a hang naming rank 1 first (its beat is the oldest), kills the job
    # (the stopped rank included) and restarts it; the final per-step losses are the
    # fault-free run's, bitwise.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    p = launch_train(["--max-restarts", "1", "--heartbeat-timeout", "4"],
                     ["--save", save, "--save-interval", "2", "--resume", "--metrics-file", m],
                     fault="attempt0:rank1:step3:stop")
    assert p.returncode == 0, p.stderr
    assert "attempt 0 failed: hang: rank 1's heartbeat stopped" in p.stderr
    assert "last beat after step 2; --heartbeat-timeout 4)" in p.stderr
    assert "restarting the whole job (attempt 1, restart 1 of 1)" in p.stderr
    assert effective_losses(m) == reference
    events = [r for r in report.read_metrics(m) if "event" in r]
    assert len(events) == 1 and events[0]["cause"].startswith("hang: rank 1's heartbeat")


@needs_mpi
def test_killed_and_stopped_ranks_in_one_run(reference, tmp_path):
    # Property: one supervised run meets both faults: rank 1 SIGKILLed at step 3 of attempt 0,
    # then rank 0 SIGSTOPped at step 5 of attempt 1 (past --heartbeat-timeout 4 s); the launcher
    # restarts twice, each time from the latest checkpoint, and the final per-step losses are
    # the fault-free run's, bitwise, with both restart events in the metrics.
    m, save = tmp_path / "m.jsonl", tmp_path / "save"
    p = launch_train(["--max-restarts", "2", "--heartbeat-timeout", "4"],
                     ["--save", save, "--save-interval", "2", "--resume", "--metrics-file", m],
                     fault="attempt0:rank1:step3:kill,attempt1:rank0:step5:stop")
    assert p.returncode == 0, p.stderr
    assert "attempt 0 failed: rank 1 (pid " in p.stderr
    assert "attempt 1 failed: hang: rank 0's heartbeat stopped" in p.stderr
    assert effective_losses(m) == reference
    causes = [r["cause"] for r in report.read_metrics(m) if "event" in r]
    assert len(causes) == 2 and "signal 9" in causes[0] and causes[1].startswith("hang: rank 0")


@needs_mpi
def test_no_restart_left_fails_with_the_cause(tmp_path):
    # Property: with --max-restarts 0 a killed rank fails the run with the rank's status
    # (128 + 9) and a message giving the cause and that no restart was left; no second attempt
    # starts.
    save = tmp_path / "save"
    p = launch_train(["--max-restarts", "0"], ["--save", save, "--save-interval", "2",
                                               "--resume"], fault="attempt0:rank1:step3:kill")
    assert p.returncode == 137, p.stderr
    assert "attempt 0 failed: rank 1 (pid " in p.stderr
    assert "was killed by signal 9 (SIGKILL); no restarts left (--max-restarts 0); exit " \
           "status 137" in p.stderr
    assert "resumed from" not in p.stdout


@needs_mpi
def test_supervised_train_needs_resume(tmp_path):
    # Property: tardelli.train under supervision refuses to run without --save DIR --resume (a
    # restart would start from scratch); that usage error (status 2) is not restarted.
    p = launch_train(["--max-restarts", "3"], ["--save", tmp_path / "save"])
    assert p.returncode == 2, p.stderr
    assert "give --save DIR --resume" in p.stderr
    assert "not restarting (exit status 2 is a usage error" in p.stderr
    assert "attempt 1" not in p.stderr


# ---- the launcher's options ----

@pytest.mark.parametrize("args, message", [
    (["--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
    (["--max-restarts", "1", "--heartbeat-timeout", "0"],
     "--heartbeat-timeout must be a positive number of seconds, got 0.0"),
    (["--max-restarts", "1", "--heartbeat-timeout", "-5"],
     "--heartbeat-timeout must be a positive number of seconds, got -5.0"),
    (["--max-restarts", "1", "--heartbeat-timeout", "5", "--startup-timeout", "0"],
     "--startup-timeout must be a positive number of seconds"),
    (["--max-restarts", "1", "--startup-timeout", "5"], "--startup-timeout needs "
     "--heartbeat-timeout"),
    (["--heartbeat-timeout", "5"], "--heartbeat-timeout and --startup-timeout need "
     "--max-restarts N"),
])
def test_bad_supervision_args_are_refused(capsys, args, message):
    # Property: inconsistent supervision options stop the launcher with status 2 and a message
    # naming the option, before anything runs.
    with pytest.raises(SystemExit) as e:
        launch._parse(["--nproc", "2", *args, "-m", "tardelli.train"])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_supervision_args_defaults():
    # Property: the startup timeout defaults to 600 s or the heartbeat timeout if longer;
    # without --max-restarts nothing is supervised.
    args, prog = launch._parse(["--nproc", "2", "--max-restarts", "2", "--heartbeat-timeout",
                                "30", "-m", "tardelli.train", "--max-restarts", "9"])
    assert (args.max_restarts, args.heartbeat_timeout, args.startup_timeout) == (2, 30.0, 600.0)
    assert prog == ["-m", "tardelli.train", "--max-restarts", "9"]
    args, _ = launch._parse(["--nproc", "2", "--max-restarts=0", "--heartbeat-timeout=900",
                             "x.py"])
    assert args.startup_timeout == 900.0
    args, _ = launch._parse(["--nproc", "2", "x.py"])
    assert args.max_restarts is None and args.heartbeat_timeout is None


def test_supervised_command_wraps_ranks_and_forwards_env():
    # Property: a supervised job runs each rank under the wrapper (this interpreter, then
    # supervisor.py, then the program unchanged), and mpirun forwards the supervision
    # variables to every rank.
    env = {name: "" for name in supervisor.ENV_NAMES[:3]}
    argv, _ = launch.build_command(2, supervisor.wrapped_program(["-m", "m", "a"]), env=env,
                                   cpu_count=2, is_root=False,
                                   which=lambda n: "/usr/bin/mpirun" if n == "mpirun" else None,
                                   flavor="openmpi")
    assert argv[-7:] == [sys.executable, os.path.abspath(supervisor.__file__), "--",
                         sys.executable, "-m", "m", "a"]
    forwarded = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"TD_HEARTBEAT_DIR", "TD_RESTART_ATTEMPT", "TD_RESTART_CAUSE"} <= set(forwarded)


# ---- the decision logic, on files written by hand ----

def write(d, name, rec, mtime):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump(rec, f)
    os.utime(path, (mtime, mtime))


def test_check_attempt_names_the_first_failed_rank(tmp_path):
    # Property: the earliest non-zero exit record is the cause (the ranks killed after it do
    # not hide it), a clean exit is not a failure, a signal gives status 128 + signal, and
    # status 2 (usage error) is not restarted.
    d = str(tmp_path)
    assert supervisor.check_attempt(d, 2, started=0, now=1) is None
    write(d, "exit.rank0", {"rank": 0, "pid": 10, "returncode": 0}, 50)
    assert supervisor.check_attempt(d, 2, started=0, now=100) is None
    write(d, "exit.rank1", {"rank": 1, "pid": 11, "returncode": -9}, 60)
    write(d, "exit.rank2", {"rank": 2, "pid": 12, "returncode": -15}, 61)
    f = supervisor.check_attempt(d, 3, started=0, now=100)
    assert f == ("rank 1 (pid 11) was killed by signal 9 (SIGKILL)", 137, True)
    write(d, "exit.rank3", {"rank": 3, "pid": 13, "returncode": 2}, 55)
    f = supervisor.check_attempt(d, 4, started=0, now=100)
    assert f == ("rank 3 (pid 13) exited with status 2", 2, False)


def test_check_attempt_detects_hangs(tmp_path):
    # Property: with a heartbeat timeout, a rank is hung once its last beat is older than the
    # timeout, or when it has not beaten startup_timeout seconds after the start; a rank done
    # with its work is not watched; the oldest beat is named first, the others listed; without
    # a heartbeat timeout nothing is a hang.
    d = str(tmp_path)
    kw = dict(started=1000, heartbeat_timeout=10, startup_timeout=60)
    assert supervisor.check_attempt(d, 2, now=1059, **kw) is None
    f = supervisor.check_attempt(d, 2, now=1061, **kw)
    assert f.status == supervisor.HANG_STATUS and f.restart
    assert f.cause.startswith("hang: rank 0 sent no heartbeat in the 61.0 s since the start "
                              "(--startup-timeout 60); also stale: rank 1")
    write(d, "rank0", {"rank": 0, "pid": 20, "step": 7, "done": False}, 1100)
    write(d, "rank1", {"rank": 1, "pid": 21, "step": 6, "done": False}, 1098)
    assert supervisor.check_attempt(d, 2, now=1107, **kw) is None
    f = supervisor.check_attempt(d, 2, now=1110.5, **kw)
    assert f.cause == ("hang: rank 1's heartbeat stopped 12.5 s ago (pid 21, last beat after "
                       "step 6; --heartbeat-timeout 10); also stale: rank 0")
    write(d, "rank1", {"rank": 1, "pid": 21, "step": 8, "done": True}, 1098)
    f = supervisor.check_attempt(d, 2, now=1110.5, **kw)
    assert f.cause.startswith("hang: rank 0's heartbeat stopped 10.5 s ago") and \
        "also stale" not in f.cause
    assert supervisor.check_attempt(d, 2, started=0, now=1e6) is None  # no heartbeat timeout


def test_parse_fault():
    # Property: the test-only fault spec parses to (attempt, rank, step, signal); anything else
    # is refused with the expected form.
    assert supervisor.parse_fault("") is None
    assert supervisor.parse_faults("attempt0:rank1:step3:kill, attempt1:rank0:step5:stop") == \
        [(0, 1, 3, signal.SIGKILL), (1, 0, 5, signal.SIGSTOP)]
    assert supervisor.parse_faults("") == []
    assert supervisor.parse_fault("attempt0:rank1:step3:kill") == (0, 1, 3, signal.SIGKILL)
    assert supervisor.parse_fault("attempt2:rank0:step10:stop") == (2, 0, 10, signal.SIGSTOP)
    for bad in ("attempt0:rank1:step3", "rank1:attempt0:step3:kill", "attempt0:rank1:step3:x",
                "attemptA:rank1:step3:kill"):
        with pytest.raises(ValueError, match="expected attempt<A>:rank<R>:step<S>:kill|stop"):
            supervisor.parse_fault(bad)


# ---- the restart loop on a plain program (one rank, no MPI) ----

PROGRAM = """
import os, sys, time
sys.path.insert(0, {here!r})
import supervisor
k = supervisor.attempt()
with open({log!r}, "a") as f:
    f.write(f"attempt {{k}} cause {{supervisor.restart_cause()!r}}\\n")
supervisor.heartbeat(0, 0)
modes = {modes!r}
mode = modes[k] if k < len(modes) else "ok"
if mode == "exit3":
    sys.exit(3)
if mode == "hang":
    time.sleep(60)
supervisor.heartbeat(0, 1, done=True)
"""


def supervise_program(tmp_path, modes, max_restarts, heartbeat_timeout=None):
    """Runs PROGRAM (attempt k behaves as modes[k]) as a one-rank job under supervise();
    returns (status, the launcher's log lines, what each attempt saw)."""
    prog, seen = tmp_path / "prog.py", tmp_path / "seen.txt"
    prog.write_text(PROGRAM.format(here=os.path.dirname(supervisor.__file__), modes=modes,
                                   log=str(seen)))
    argv = [sys.executable] + supervisor.wrapped_program([str(prog)])
    lines = []
    status = supervisor.supervise(argv, dict(os.environ), 1, max_restarts, heartbeat_timeout,
                                  startup_timeout=30, max_time=60, log=lines.append)
    return status, lines, seen.read_text()


def test_supervise_restarts_until_clean(tmp_path):
    # Property: attempt 0 exits 3, attempt 1 hangs (sleeps with no heartbeat for longer than
    # the 1 s timeout), attempt 2 finishes: status 0, one log line per failure with its cause
    # and the next attempt, and each attempt sees its number and the previous cause.
    status, lines, out = supervise_program(tmp_path, ["exit3", "hang"], 2,
                                           heartbeat_timeout=1.0)
    assert status == 0
    assert len(lines) == 3, lines
    assert "attempt 0 failed: rank 0 (pid " in lines[0] and "exited with status 3; " \
        "restarting the whole job (attempt 1, restart 1 of 2)" in lines[0]
    assert "attempt 1 failed: hang: rank 0's heartbeat stopped" in lines[1]
    assert "restarting the whole job (attempt 2, restart 2 of 2)" in lines[1]
    assert lines[2] == "tardelli.launch: attempt 2 finished cleanly after 2 restart(s)"
    seen = [line for line in out.splitlines() if line.startswith("attempt")]
    assert seen[0] == "attempt 0 cause ''"
    assert seen[1].startswith("attempt 1 cause 'rank 0 (pid ") and "status 3" in seen[1]
    assert seen[2].startswith("attempt 2 cause \"hang: rank 0's heartbeat")


def test_supervise_exhausted_returns_the_last_status(tmp_path):
    # Property: when every attempt fails, the run's status is the last attempt's (3 here), with
    # a message saying no restart is left.
    status, lines, _ = supervise_program(tmp_path, ["exit3", "exit3"], 1)
    assert status == 3
    assert "attempt 1 failed: rank 0 (pid " in lines[-1]
    assert lines[-1].endswith("exited with status 3; no restarts left (--max-restarts 1); exit "
                              "status 3")


# ---- the metrics history ----

def test_metrics_history_of_a_supervised_run(tmp_path):
    # Property: effective_rows gives the last row of each step, in step order, without the
    # event rows (the file a supervised run leaves: attempt 0's rows, a restart event, attempt
    # 1's rows from its checkpoint on; the C++ MetricsFile that writes it is tested in
    # tests/train/test_metrics_file.cpp).
    path = tmp_path / "m.jsonl"
    rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": 3.0},
            {"event": "restart", "attempt": 1, "step": 2, "cause": "x"},
            {"step": 3, "loss": 30.0}, {"step": 4, "loss": 40.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = report.read_metrics(str(path))
    assert got == rows
    assert report.effective_rows(got) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0},
                                          {"step": 3, "loss": 30.0}, {"step": 4, "loss": 40.0}]
