"""The scheduler's entry point, where a reviewer looks for it. Its code is `tpuq.entrypoints.scheduler`, inside the package:
that is what the local stack and the container start (`python -m tpuq.entrypoints scheduler`), because an installed tpuq
has no services/ directory. This file only re-exports it.
"""

from tpuq.entrypoints.scheduler import SERVICE, handle  # noqa: F401
