"""tardelli.train: train a GPT from the command line (`python -m tardelli.train --help`) or
from Python (`tardelli.train.run(["--synthetic-data", "--vocab-size", "512", ...])`)."""
import sys

from .config import ConfigError, TrainConfig, parse_config, validate  # noqa: F401
from .trainer import join_world, train  # noqa: F401


def run(argv=None):
    """Parses argv like the CLI and trains (as one rank of the job when launched with
    several); returns the summary dict."""
    world = join_world()
    cfg, _ = parse_config(argv, world.size if world is not None else 1)
    return train(cfg, world)


def main(argv=None):
    from .. import TardelliError
    try:
        run(argv)
    except ConfigError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr)
        return 2
    except TardelliError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr, flush=True)
        _end_job_after_error(1)
        return 1
    return 0


def _end_job_after_error(code):
    """A run-time error on one rank must not leave the others blocked in a collective until the
    timeout (nor this rank in MPI_Finalize, which waits for them): in a job of several ranks the
    whole job ends now with `code` (MPI_Abort). Errors every rank raises alike (bad flags)
    are ConfigErrors and exit normally."""
    from .. import distributed as dist
    if dist.is_initialized() and dist.world_size() > 1:
        sys.stdout.flush()
        dist._D.abort_world(code)
