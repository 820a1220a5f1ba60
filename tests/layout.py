"""Where the production package's source lives: pyproject.toml maps each folder of the design card's layout
(shared/, services/<name>/, operations/, cli/, deploy/, infra/) to its package. Tests that read every production
module go through here, so that a moved folder is never silently left out of a scan.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    """{package name: its folder}, as pyproject.toml's [tool.setuptools.package-dir] maps them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {package: REPO / folder for package, folder in config["package-dir"].items()}


def packages() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def production_modules() -> dict[str, Path]:
    """{dotted module name: file} for every .py file the wheel carries (tpuq and its mapped subpackages)."""
    dirs = package_dirs()
    mapped = set(dirs.values())
    found: dict[str, Path] = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            # a folder mapped as its own package is read under its own name, not its parent's
            if any(other != folder and other in path.parents and folder in other.parents for other in mapped):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def is_package_file(path: Path) -> bool:
    return path.name == "__init__.py"
