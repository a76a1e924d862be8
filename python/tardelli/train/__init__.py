"""tardelli.train: train a GPT from the command line (`python -m tardelli.train --help`) or
from Python (`tardelli.train.run(["--synthetic-data", "--vocab-size", "512", ...])`)."""
from .config import ConfigError, TrainConfig, parse_config, validate  # noqa: F401
from .trainer import join_world, train  # noqa: F401


def run(argv=None):
    """Parses argv like the CLI and trains (as one rank of the job when launched with
    several); returns the summary dict."""
    world = join_world()
    cfg, _ = parse_config(argv, world.size if world is not None else 1)
    return train(cfg, world)


def main(argv=None):
    import sys

    from .. import TardelliError
    try:
        run(argv)
    except ConfigError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr)
        return 2
    except TardelliError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr)
        return 1
    return 0
