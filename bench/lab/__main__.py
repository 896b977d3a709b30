"""`python -m bench.lab`: the shaped-network lab (bench/lab/run.py)."""

import sys

from bench.lab.run import main

sys.exit(main())
