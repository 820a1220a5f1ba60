"""Installed as the package `tpuq._infra` (pyproject.toml maps it), so that `tpuq deploy` reads these files
from the wheel (`importlib.resources`) and not from a source tree that an installed tpuq does not have."""
