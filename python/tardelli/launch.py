"""`python -m tardelli.launch --nproc N (-m module | script.py) args...`: see
tardelli/distributed/launch.py."""
import sys

from .distributed.launch import main

if __name__ == "__main__":
    sys.exit(main())
