"""Production code never imports dev tooling.

- tpuq (src/tpuq, what every Cloud Run image installs) imports nothing from tpuq_dev (dev/, the dev extra):
  the CLI finds `tpuq demo` and `tpuq dev` through an entry point, never through an import.
- The four services never load the capacity model (tpuq.capacitymodel, the fake's and the simulator's state
  machine) nor the in-memory stores: checked on what importing each service really loads.
- The capacity model itself stays HTTP- and SSH-free, so that the simulator runs it from a plain install.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tpuq
from tpuq import topology

PACKAGE_ROOT = Path(tpuq.__file__).resolve().parent
DEV_PACKAGE = "tpuq_dev"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    """The absolute names an import statement loads (`from tpuq import demo` loads tpuq.demo)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = importer.split(".")
            package = package if is_package else package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def imports_of(source: str, importer: str, is_package: bool, forbidden: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, module) for every import of a forbidden package anywhere in one file, functions included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for name in imported_modules(node, importer, is_package):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append((node.lineno, name))
                break
    return sorted(found)


def test_no_module_of_tpuq_imports_the_dev_package():
    offenders = [f"{p.relative_to(PACKAGE_ROOT)}:{line} imports {name}"
                 for p in sorted(PACKAGE_ROOT.rglob("*.py"))
                 for line, name in imports_of(p.read_text(), module_name(p), p.name == "__init__.py", (DEV_PACKAGE,))]
    assert offenders == []


def test_the_scan_sees_function_level_and_relative_imports():
    source = "import os\n\ndef later():\n    from .capacitymodel import model\n\nfrom tpuq_dev import demo\n"
    assert imports_of(source, "tpuq.some_service", False, (DEV_PACKAGE, "tpuq.capacitymodel")) == [
        (4, "tpuq.capacitymodel"), (6, "tpuq_dev")]


def loaded_modules(statement: str) -> set[str]:
    """What a fresh interpreter has loaded after one import statement."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def under(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("service", topology.SERVICES)
def test_a_service_loads_neither_dev_tooling_nor_the_capacity_model(service):
    modules = loaded_modules(f"import tpuq.entrypoints.{service} as e; e.handle")
    assert f"tpuq.{service}" in modules
    assert under(modules, DEV_PACKAGE, "tpuq.capacitymodel", "tpuq.inmemory") == []


def test_the_capacity_model_runs_without_http_ssh_or_dev_tooling():
    modules = loaded_modules("import tpuq.capacitymodel.model, tpuq.capacitymodel.scenario")
    assert under(modules, DEV_PACKAGE, "flask", "werkzeug", "paramiko", "requests") == []


def test_the_cli_finds_the_dev_commands_without_importing_the_local_stack():
    modules = loaded_modules("import tpuq.cli.app")
    assert "tpuq_dev.cli" in modules  # the entry point, found through package metadata
    assert under(modules, "tpuq_dev.devstack", "tpuq_dev.faketpu", "tpuq_dev.demo") == []
