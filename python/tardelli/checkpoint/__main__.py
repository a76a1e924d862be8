"""`python -m tardelli.checkpoint inspect|convert` (tardelli/train/checkpoint_tool.py)."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
