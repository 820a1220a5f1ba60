"""`python -m tpuq.runtime.entrypoints SERVICE [--host H] [--port P]`: serve one service from the installed package.

A Dockerfile's CMD cannot name a file inside site-packages, and functions-framework's `--source` takes only a file;
this finds the installed entry module and runs functions-framework on it, exactly as
`python -m functions_framework --source <file> --target handle --signature-type http ...` would.
"""

from __future__ import annotations

import runpy
import sys

from tpuq.contracts import topology
from tpuq.runtime.entrypoints import UnknownService, functions_framework_args


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m tpuq.runtime.entrypoints {{{','.join(topology.SERVICES)}}} [--host H] [--port P]",
              file=sys.stderr)
        return 2
    try:
        args = functions_framework_args(argv[0])
    except UnknownService as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.argv = ["functions_framework", *args, *argv[1:]]
    runpy.run_module("functions_framework", run_name="__main__", alter_sys=True)  # serves until stopped
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
