"""Starts N ranks of a program: `python -m tardelli.launch --nproc N [options] (-m module |
script.py | executable) args...` (an executable that is not a .py file, such as tardelli-train,
runs as it is; the rest with this interpreter).

Under SLURM (SLURM_JOB_ID set and srun on PATH) the ranks start through `srun -n N`, otherwise
through `mpirun -np N` (Open MPI or MPICH), with this interpreter (sys.executable) and the
caller's environment (PYTHONPATH included). The exit status is the job's. Inside the program,
td.distributed.init() joins the job; td.distributed.is_main_process() picks the rank that
prints. `mpirun -np N python -m module ...` works as well: the launcher only saves typing.

With --max-restarts N the launcher supervises the job: a rank that dies, or (with
--heartbeat-timeout S) stops beating, makes it kill the whole job and start it again, up to N
times (tardelli/distributed/supervisor.py; docs/distributed.md, "Supervised restarts").
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys

from . import supervisor

# Variables every rank needs from the launching shell. Open MPI forwards the environment only to
# ranks on the local node; -x names them for the remote ones too.
_FORWARD_ENV = ("PYTHONPATH", "TD_COMM_TIMEOUT_S", "OMP_NUM_THREADS",
                "LD_LIBRARY_PATH") + supervisor.ENV_NAMES


def mpi_flavor(mpirun="mpirun"):
    """'openmpi' or 'mpich', from `mpirun --version` (Open MPI when it cannot tell)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "openmpi"
    return "mpich" if ("HYDRA" in out or "MPICH" in out) else "openmpi"


def build_command(nproc, program, env=None, cpu_count=None, is_root=None, which=shutil.which,
                  flavor=None, python=None, extra_launcher_args=()):
    """The launch command and its environment, without running anything.

    program: the argv after the interpreter (["-m", "pkg.mod", ...] or ["script.py", ...]), or
    a native executable's argv (["/path/tardelli-train", ...]: a file that is executable and
    does not end in .py), which runs without the interpreter.
    Returns (argv, env). Open MPI gets --bind-to none (ranks share the cores through OpenMP
    threads), --oversubscribe when nproc > cpu_count, and --allow-run-as-root with the
    OMPI_ALLOW_RUN_AS_ROOT* variables when running as root. OMP_NUM_THREADS defaults to
    cpu_count // nproc (at least 1) and is forwarded to every rank.
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    env = dict(os.environ if env is None else env)
    cpu_count = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    python = python or sys.executable
    program = list(program)
    target = program if supervisor.is_native_program(program) else [python] + program
    # Ranks share this node's cores: without a limit every rank's OpenMP pool would take all
    # of them and oversubscribe the machine nproc-fold (torchrun sets 1; we split the cores).
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count // nproc)))

    if env.get("SLURM_JOB_ID") and which("srun"):
        return ["srun", "-n", str(nproc), "--kill-on-bad-exit=1", *extra_launcher_args,
                *target], env

    mpirun = which("mpirun") or which("mpiexec")
    if mpirun is None:
        raise RuntimeError("tardelli.launch: neither srun (under SLURM) nor mpirun/mpiexec is on "
                           "PATH; install Open MPI or MPICH")
    flavor = flavor or mpi_flavor(mpirun)
    argv = [mpirun, "-np", str(nproc)]
    if flavor == "openmpi":
        argv += ["--bind-to", "none"]
        if nproc > cpu_count:
            argv.append("--oversubscribe")
        if is_root:
            argv.append("--allow-run-as-root")
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        for name in _FORWARD_ENV:
            if name in env:
                argv += ["-x", name]
    else:  # MPICH / Hydra: oversubscription is allowed by default.
        argv += ["-bind-to", "none"]
        names = [n for n in _FORWARD_ENV if n in env]
        if names:
            argv += ["-genvlist", ",".join(names)]
    argv += list(extra_launcher_args)
    return argv + target, env


def _parse(argv):
    """Splits argv into the launcher's options and the program: everything from `-m module` or
    the first non-option argument on belongs to the program."""
    parser = argparse.ArgumentParser(
        prog="python -m tardelli.launch",
        usage="%(prog)s --nproc N [--timeout S] [--max-time S] [--max-restarts N "
              "[--heartbeat-timeout S] [--startup-timeout S]] (-m module | script.py) [args...]")
    parser.add_argument("--nproc", "--nproc-per-node", "-n", type=int, required=True,
                        help="number of ranks")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds any collective may wait before failing (TD_COMM_TIMEOUT_S)")
    parser.add_argument("--max-time", type=float, default=None,
                        help="seconds after which the whole job is killed (exit status 124)")
    parser.add_argument("--launcher-arg", action="append", default=[],
                        help="extra argument for mpirun/srun (repeatable)")
    parser.add_argument("--max-restarts", type=int, default=None,
                        help="supervise the job: restart all of it when a rank dies or hangs, "
                             "at most N times (the program must resume from its checkpoints: "
                             "tardelli.train needs --save DIR --resume)")
    parser.add_argument("--heartbeat-timeout", type=float, default=None,
                        help="with --max-restarts: a rank whose heartbeat (written after every "
                             "step by tardelli.train) stops for S seconds is hung")
    parser.add_argument("--startup-timeout", type=float, default=None,
                        help="with --heartbeat-timeout: seconds a rank may take to its first "
                             "heartbeat (default: 600, or the heartbeat timeout if longer)")
    opts, program, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            if i + 1 >= len(argv):
                parser.error("-m needs a module name")
            program = ["-m", argv[i + 1]] + argv[i + 2:]
            break
        if a.startswith("-m") and len(a) > 2 and not a.startswith("--"):
            program = ["-m", a[2:]] + argv[i + 1:]
            break
        if not a.startswith("-"):
            program = argv[i:]
            break
        opts.append(a)
        if "=" not in a and a in _VALUED and i + 1 < len(argv):
            opts.append(argv[i + 1])
            i += 1
        i += 1
    args = parser.parse_args(opts)
    if program is None:
        parser.error("give the program to run: -m module or script.py")
    error = check_supervision_args(args)
    if error:
        parser.error(error)
    return args, program


_VALUED = ("--nproc", "--nproc-per-node", "-n", "--timeout", "--max-time", "--launcher-arg",
           "--max-restarts", "--heartbeat-timeout", "--startup-timeout")


def check_supervision_args(args):
    """The error message for inconsistent supervision options, or None; fills in the default
    startup timeout."""
    if args.max_restarts is None:
        if args.heartbeat_timeout is not None or args.startup_timeout is not None:
            return "--heartbeat-timeout and --startup-timeout need --max-restarts N " \
                   "(0: detect failures without restarting)"
        return None
    if args.max_restarts < 0:
        return f"--max-restarts must be >= 0, got {args.max_restarts}"
    for name in ("heartbeat_timeout", "startup_timeout"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            return f"--{name.replace('_', '-')} must be a positive number of seconds, got {v}"
    if args.startup_timeout is not None and args.heartbeat_timeout is None:
        return "--startup-timeout needs --heartbeat-timeout"
    if args.heartbeat_timeout is not None and args.startup_timeout is None:
        args.startup_timeout = max(args.heartbeat_timeout, supervisor.DEFAULT_STARTUP_TIMEOUT)
    return None


def run(argv, env, max_time=None):
    """Runs the job; returns its exit status (128 + signal for a rank killed by a signal,
    124 when max_time expired)."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=max_time)
    except subprocess.TimeoutExpired:
        print(f"tardelli.launch: job still running after {max_time} s; killing it",
              file=sys.stderr, flush=True)
        _kill_group(proc)
        return 124
    except KeyboardInterrupt:
        _kill_group(proc, signal.SIGINT)
        return 130
    return 128 - code if code < 0 else code


def _kill_group(proc, sig=signal.SIGTERM):
    """Signals the launcher and every rank it started (they share its new session), then waits."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def main(argv=None):
    args, program = _parse(sys.argv[1:] if argv is None else list(argv))
    if program[0] != "-m" and not os.path.exists(program[0]):
        print(f"tardelli.launch: no such script: {program[0]}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.timeout is not None:
        env["TD_COMM_TIMEOUT_S"] = str(args.timeout)
    # The ranks import tardelli the way this process did: keep its package root on their path.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in [os.path.abspath(p) for p in paths]:
        env["PYTHONPATH"] = os.pathsep.join(paths + [root])
    supervised = args.max_restarts is not None
    if supervised:
        # Present now so that build_command forwards them; supervise() sets each attempt's.
        for name in supervisor.ENV_NAMES[:3]:
            env.setdefault(name, "")
        program = supervisor.wrapped_program(program)
    try:
        cmd, env = build_command(args.nproc, program, env=env,
                                 extra_launcher_args=args.launcher_arg)
    except (RuntimeError, ValueError) as e:
        print(str(e), file=sys.stderr)
        return 2
    if supervised:
        return supervisor.supervise(cmd, env, args.nproc, args.max_restarts,
                                    args.heartbeat_timeout, args.startup_timeout or 0,
                                    args.max_time)
    return run(cmd, env, max_time=args.max_time)


if __name__ == "__main__":
    sys.exit(main())
