"""`python -m tpuq.cli`: the same as the `tpuq` console script."""

import sys

from tpuq.cli import main

sys.exit(main())
