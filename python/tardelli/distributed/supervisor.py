"""Supervised restarts: `python -m tardelli.launch --max-restarts N [--heartbeat-timeout S]`.

The launcher runs the job as attempts. Each attempt gets a fresh directory (TD_HEARTBEAT_DIR)
shared with its ranks; in it every rank leaves two kinds of file:

    rank<R>        its heartbeat, rewritten after every step (heartbeat(), called by the
                   program: tardelli.train does); the file's mtime is the time of the beat, the
                   content {"rank", "pid", "step", "done"}
    exit.rank<R>   how it ended, {"rank", "pid", "returncode"}, written by the rank wrapper
                   (this file run as a script) around the program, which then exits with the
                   program's status

The launcher polls the directory and the mpirun/srun process. The first rank that exits
non-zero or is killed by a signal, or whose heartbeat stops for --heartbeat-timeout seconds,
fails the attempt: the launcher kills the whole job (every process of its session) and starts
a new one, with TD_RESTART_ATTEMPT=k and TD_RESTART_CAUSE set, up to N times. The program must
continue from its checkpoints by itself (tardelli.train: --save DIR --resume, which it requires
under supervision). Only the standard library is imported here: the rank wrapper starts before
the program and must cost nothing.

Note [Supervised restart]: why a wrapper per rank and not mpirun's status alone. mpirun's exit
status is the dead rank's code or 128 + its signal, but not which rank it was; the wrapper is
the rank's parent, so it knows the exact status and the rank, and the first exit file to appear
(by mtime) names the rank that failed first: the others die after it, killed by mpirun or the
launcher. A hang has no exit: only the heartbeat shows it. A rank stuck in a collective stops
beating too, so every rank of a hung job goes stale; the cause names first the rank whose beat
is the oldest (the one that stopped first), and lists the others.
"""
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HEARTBEAT_DIR = "TD_HEARTBEAT_DIR"
ATTEMPT = "TD_RESTART_ATTEMPT"
CAUSE = "TD_RESTART_CAUSE"
TEST_FAULT = "TD_TEST_FAULT"
# Every variable a supervised rank reads from the launcher (forwarded to remote ranks).
ENV_NAMES = (HEARTBEAT_DIR, ATTEMPT, CAUSE, TEST_FAULT)
_RANK_ENV = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
# Exit status 2 is a usage error (argparse's convention; tardelli.train's ConfigError): a
# restart would fail alike, so it ends the run.
USAGE_ERROR = 2
HANG_STATUS = 124  # a hung attempt's status, as for --max-time (timeout(1)'s convention)
DEFAULT_STARTUP_TIMEOUT = 600.0
_MAX_TIME = "--max-time expired"


# ---- in the ranks ----

def attempt(env=None):
    """This job's attempt under `tardelli.launch --max-restarts` (0 for the first), or None when
    the launcher does not supervise it."""
    v = (os.environ if env is None else env).get(ATTEMPT, "")
    return int(v) if v.isdigit() else None


def restart_cause(env=None):
    """Why the previous attempt failed (empty for attempt 0 or when not supervised)."""
    return (os.environ if env is None else env).get(CAUSE, "")


def heartbeat(rank, step, done=False):
    """Tells a supervising launcher that `rank` is alive and has finished `step` (done=True:
    the program's work is over, stop watching its heartbeat). Does nothing when not supervised.
    The file is replaced atomically, so the launcher never reads a partial one."""
    d = os.environ.get(HEARTBEAT_DIR)
    if not d:
        return
    _inject_fault(rank, step)
    path = os.path.join(d, f"rank{rank}")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "step": step, "done": done}, f)
    os.replace(path + ".tmp", path)


def parse_fault(spec):
    """TD_TEST_FAULT "attempt<A>:rank<R>:step<S>:(kill|stop)" -> (A, R, S, signal); None if
    empty. A testing aid: rank R of attempt A sends itself SIGKILL or SIGSTOP at the heartbeat
    of step S, before writing it (so its last beat is the step before)."""
    if not spec:
        return None
    parts = spec.split(":")
    sigs = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
    keys = ("attempt", "rank", "step")
    if len(parts) != 4 or parts[3] not in sigs or not all(
            p.startswith(k) and p[len(k):].isdigit() for p, k in zip(parts, keys)):
        raise ValueError(f"{TEST_FAULT}={spec!r}: expected attempt<A>:rank<R>:step<S>:kill|stop")
    return tuple(int(p[len(k):]) for p, k in zip(parts, keys)) + (sigs[parts[3]],)


def parse_faults(spec):
    """TD_TEST_FAULT as a comma-separated list of faults (parse_fault each): a run can meet
    several, e.g. a SIGKILL in attempt 0 and a SIGSTOP in attempt 1."""
    return [parse_fault(s.strip()) for s in (spec or "").split(",") if s.strip()]


def _inject_fault(rank, step):
    for fault in parse_faults(os.environ.get(TEST_FAULT, "")):
        if fault[:3] == (attempt(), rank, step):
            os.kill(os.getpid(), fault[3])


# ---- the rank wrapper (this file run as a script) ----

def env_rank(env=None):
    env = os.environ if env is None else env
    for name in _RANK_ENV:
        if env.get(name, "").isdigit():
            return int(env[name])
    return 0


def _die_with_parent():
    """A preexec_fn (Linux): the program gets SIGKILL if its wrapper dies (prctl
    PR_SET_PDEATHSIG), so killing a wrapper never leaves its rank running; None elsewhere."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)


def wrap_rank(argv):
    """Runs one rank's program as a child; records its end in TD_HEARTBEAT_DIR/exit.rank<R>
    and returns its status (128 + signal when killed by one). Signals sent to the wrapper
    (mpirun's SIGTERM when it ends the job) are passed on to the program."""
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent())
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, lambda n, _frame: child.send_signal(n))
    code = child.wait()
    rank = env_rank()
    path = os.path.join(os.environ[HEARTBEAT_DIR], f"exit.rank{rank}")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": child.pid, "returncode": code}, f)
    os.replace(path + ".tmp", path)
    return 128 - code if code < 0 else code


def is_native_program(program):
    """Whether `program` (a launcher's argv after the interpreter) is a native executable such
    as tardelli-train: a file that is executable and is neither `-m module` nor a .py script.
    It then runs as it is, without the interpreter."""
    program = list(program)
    return bool(program) and program[0] != "-m" and not program[0].endswith(".py") and \
        os.path.isfile(program[0]) and os.access(program[0], os.X_OK)


def wrapped_program(program, python=None):
    """The argv after the interpreter that runs `program` (["-m", mod, ...], [script, ...] or a
    native executable's argv) under the rank wrapper."""
    interpreter = [] if is_native_program(program) else [python or sys.executable]
    return [os.path.abspath(__file__), "--"] + interpreter + list(program)


# ---- the launcher's decisions (pure functions of the directory and the clock) ----

Failure = collections.namedtuple("Failure", "cause status restart")
Failure.__doc__ = """Why an attempt failed: cause (one line), status (the exit status the
launcher returns if it is the last attempt), restart (False: restarting cannot help)."""


def describe_returncode(code):
    """'exited with status 3' / 'was killed by signal 9 (SIGKILL)' for a Popen returncode, or
    for a shell-style status above 128."""
    sig = -code if code < 0 else None
    if sig is None:
        return f"exited with status {code}"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {sig} ({name})"


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f), os.stat(path).st_mtime
    except (OSError, ValueError):
        return None, None


def read_exits(d):
    """The exit records in attempt directory d, earliest first: [(mtime, record)]."""
    out = []
    for name in os.listdir(d):
        if name.startswith("exit.rank") and not name.endswith(".tmp"):
            rec, mtime = _read_json(os.path.join(d, name))
            if rec is not None:
                out.append((mtime, rec))
    return sorted(out, key=lambda e: (e[0], e[1]["rank"]))


def read_beats(d):
    """rank -> (mtime of its last beat, record)."""
    out = {}
    for name in os.listdir(d):
        if name.startswith("rank") and name[4:].isdigit():
            rec, mtime = _read_json(os.path.join(d, name))
            if rec is not None:
                out[int(name[4:])] = (mtime, rec)
    return out


def check_attempt(d, nproc, started, now, heartbeat_timeout=None,
                  startup_timeout=DEFAULT_STARTUP_TIMEOUT):
    """The failure of the attempt whose directory is d, or None while it looks healthy.

    A rank that ended badly comes first (the earliest exit record with a non-zero status).
    Then, with a heartbeat_timeout, hangs: a rank whose last beat is older than
    heartbeat_timeout seconds, or one that has not beaten at all `startup_timeout` seconds
    after `started` (start-up: imports, building the model, loading the checkpoint). A rank
    whose last beat says done is not watched any more. Times are time.time() seconds."""
    for _, rec in read_exits(d):
        code = rec["returncode"]
        if code != 0:
            status = 128 - code if code < 0 else code
            return Failure(f"rank {rec['rank']} (pid {rec['pid']}) {describe_returncode(code)}",
                           status, status != USAGE_ERROR)
    if not heartbeat_timeout:
        return None
    beats = read_beats(d)
    stale = []  # (time of the last beat or start, rank, description)
    for r in range(nproc):
        if r not in beats:
            if now - started > startup_timeout:
                stale.append((started, r, f"rank {r} sent no heartbeat in the "
                              f"{now - started:.1f} s since the start (--startup-timeout "
                              f"{startup_timeout:g})"))
            continue
        mtime, rec = beats[r]
        if not rec.get("done") and now - mtime > heartbeat_timeout:
            stale.append((mtime, r, f"rank {r}'s heartbeat stopped {now - mtime:.1f} s ago "
                          f"(pid {rec['pid']}, last beat after step {rec['step']}; "
                          f"--heartbeat-timeout {heartbeat_timeout:g})"))
    if not stale:
        return None
    stale.sort()
    cause = "hang: " + stale[0][2]
    if len(stale) > 1:
        cause += "; also stale: " + ", ".join(f"rank {r}" for _, r, _ in stale[1:])
    return Failure(cause, HANG_STATUS, True)


# ---- the launcher's loop ----

def _session_pids(sid):
    """The live (non-zombie) processes of session `sid` on this machine (Linux /proc), or None
    where /proc cannot tell."""
    if not os.path.isdir("/proc/self"):
        return None
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_session(proc, grace=5.0, wait_first=0.0):
    """Ends a job started with start_new_session=True. mpirun may be ending it already (after
    a rank's death): it gets `wait_first` seconds to do so. Then every process of the session
    (mpirun gives each rank its own process group, so a group kill would miss them) gets
    SIGTERM, the ranks SIGCONT too (a stopped rank must run to act on it), and after `grace`
    seconds whatever is left gets SIGKILL. Returns once no process of the session is left (or
    after 10 s more)."""
    try:
        proc.wait(timeout=wait_first)
    except subprocess.TimeoutExpired:
        pass
    pids = _session_pids(proc.pid)
    if pids is None:  # no /proc: the launcher's group, and mpirun passes the signal on
        from .launch import _kill_group
        _kill_group(proc)
        return
    if proc.poll() is None:
        _signal_all(pids, signal.SIGTERM)
        _signal_all([p for p in pids if p != proc.pid], signal.SIGCONT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    end = time.time() + 10
    while True:
        left = _session_pids(proc.pid)
        if not left or time.time() > end:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    proc.wait()


def _watch(proc, d, nproc, started, heartbeat_timeout, startup_timeout, deadline, poll):
    """Waits for the attempt: None when it ended with status 0, else its Failure."""
    while True:
        code = proc.poll()  # before reading d: exit records are written before mpirun exits
        failure = check_attempt(d, nproc, started, time.time(), heartbeat_timeout,
                                startup_timeout)
        if failure is not None:
            return failure
        if code is not None:
            if code == 0:
                return None
            return Failure(f"the job (mpirun/srun) {describe_returncode(code)}",
                           128 - code if code < 0 else code, code != USAGE_ERROR)
        if deadline is not None and time.time() > deadline:
            return Failure(_MAX_TIME, 124, False)
        time.sleep(poll)


def supervise(argv, env, nproc, max_restarts, heartbeat_timeout=None,
              startup_timeout=DEFAULT_STARTUP_TIMEOUT, max_time=None, log=None):
    """Runs the job `argv` (built with wrapped_program and the ENV_NAMES in env, so that mpirun
    forwards them) up to 1 + max_restarts times; returns 0 after the first attempt that ends
    cleanly, else the last attempt's status. Each failure is logged with its cause."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    root = tempfile.mkdtemp(prefix="td-heartbeat-")
    deadline = None if max_time is None else time.time() + max_time
    poll = 0.2 if not heartbeat_timeout else min(0.2, heartbeat_timeout / 10)
    cause = ""
    try:
        for k in range(max_restarts + 1):
            d = os.path.join(root, f"attempt{k}")
            os.mkdir(d)
            e = dict(env, **{HEARTBEAT_DIR: d, ATTEMPT: str(k), CAUSE: cause})
            started = time.time()
            proc = subprocess.Popen(argv, env=e, start_new_session=True)
            try:
                failure = _watch(proc, d, nproc, started, heartbeat_timeout, startup_timeout,
                                 deadline, poll)
            except KeyboardInterrupt:
                kill_session(proc)
                return 130
            if failure is None:
                if k > 0:
                    log(f"tardelli.launch: attempt {k} finished cleanly after {k} restart(s)")
                return 0
            # After a death mpirun (srun --kill-on-bad-exit) ends the job by itself.
            kill_session(proc, wait_first=0.0 if failure.status == HANG_STATUS else 5.0)
            cause = failure.cause
            if not failure.restart:
                why = "the run's time is spent" if cause == _MAX_TIME else \
                    f"exit status {USAGE_ERROR} is a usage error: a restart would fail alike"
                log(f"tardelli.launch: attempt {k} failed: {cause}; not restarting ({why}); "
                    f"exit status {failure.status}")
                return failure.status
            if k == max_restarts:
                log(f"tardelli.launch: attempt {k} failed: {cause}; no restarts left "
                    f"(--max-restarts {max_restarts}); exit status {failure.status}")
                return failure.status
            log(f"tardelli.launch: attempt {k} failed: {cause}; restarting the whole job "
                f"(attempt {k + 1}, restart {k + 1} of {max_restarts})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # the rank wrapper: supervisor.py -- PYTHON PROGRAM ARGS...
    if len(sys.argv) < 3 or sys.argv[1] != "--":
        sys.exit("usage: supervisor.py -- PROGRAM [ARGS...] (started by tardelli.launch)")
    sys.exit(wrap_rank(sys.argv[2:]))
