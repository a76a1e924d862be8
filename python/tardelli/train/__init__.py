"""tardelli.train: train a GPT from the command line (`python -m tardelli.train --help`) or
from Python (`tardelli.train.run(["--synthetic-data", "--vocab-size", "512", ...])`)."""
from .config import ConfigError, TrainConfig, parse_config, validate  # noqa: F401
from .trainer import train  # noqa: F401


def run(argv=None):
    """Parses argv like the CLI and trains; returns the summary dict."""
    cfg, _ = parse_config(argv)
    return train(cfg)


def main(argv=None):
    import sys

    from .. import TardelliError
    try:
        cfg, _ = parse_config(argv)
        train(cfg)
    except ConfigError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr)
        return 2
    except TardelliError as e:
        print(f"python -m tardelli.train: error: {e}", file=sys.stderr)
        return 1
    return 0
