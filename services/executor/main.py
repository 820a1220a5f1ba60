"""The executor's entry point, where a reviewer looks for it. Its code is `tpuq.entrypoints.executor`, inside the package:
that is what the local stack and the container start (`python -m tpuq.entrypoints executor`), because an installed tpuq
has no services/ directory. This file only re-exports it.
"""

from tpuq.entrypoints.executor import SERVICE, handle  # noqa: F401
