"""The janitor's entry point, where a reviewer looks for it. Its code is `tpuq.entrypoints.janitor`, inside the package:
that is what the local stack and the container start (`python -m tpuq.entrypoints janitor`), because an installed tpuq
has no services/ directory. This file only re-exports it.
"""

from tpuq.entrypoints.janitor import SERVICE, handle  # noqa: F401
