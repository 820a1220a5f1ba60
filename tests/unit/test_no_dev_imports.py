"""Production carries only production (issue 33 §2).

- tpuq (shared/, services/, operations/, cli/, deploy/: what every Cloud Run image installs) imports nothing from
  tpuq_dev (dev/, the dev and simulate extras): the CLI finds `tpuq demo`, `tpuq simulate` and `tpuq dev` through
  an entry point, never through an import.
- A fresh interpreter that imports a service, the CLI's core, deploy or the dashboard loads none of the simulator,
  the capacity model or the in-memory store: checked on what the import really loads (tests/packaging/test_wheel.py
  checks that the wheel does not carry them).
- The capacity model itself stays HTTP- and SSH-free, so that the simulator runs it without the local stack.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layout import REPO, production_modules
from tpuq.contracts import topology

DEV_PACKAGE = "tpuq_dev"
STAND_INS = ("tpuq_dev.simulate", "tpuq_dev.capacitymodel", "tpuq_dev.inmemory")


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
    modules = production_modules()
    offenders = [f"{p.relative_to(REPO)}:{line} imports {name}"
                 for module, p in modules.items()
                 for line, name in imports_of(p.read_text(), module, p.name == "__init__.py", (DEV_PACKAGE,))]
    assert len(modules) > 140 and offenders == []


def test_the_scan_sees_function_level_and_relative_imports():
    source = "import os\n\ndef later():\n    from .inmemory import firestore\n\nfrom tpuq_dev import demo\n"
    assert imports_of(source, "tpuq_dev.some_tool", False, ("tpuq_dev.inmemory",)) == [(4, "tpuq_dev.inmemory")]
    assert imports_of(source, "tpuq.some_service", False, (DEV_PACKAGE,)) == [(6, "tpuq_dev")]


def loaded_modules(statement: str) -> set[str]:
    """What a fresh interpreter has loaded after one import statement."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def under(modules: set[str], *packages: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("service", topology.SERVICES)
def test_a_service_loads_neither_dev_tooling_nor_the_stand_ins(service):
    modules = loaded_modules(f"import tpuq.{service}.main as e; e.handle")
    assert f"tpuq.{service}.handlers" in modules
    assert under(modules, DEV_PACKAGE, *STAND_INS) == []


@pytest.mark.parametrize("statement", [
    "import tpuq.cli.jobs, tpuq.cli.files, tpuq.cli.fleet, tpuq.operations.submit, tpuq.operations.queries",
    "import tpuq.deploy.cli, tpuq.deploy.plan",
    "import tpuq.ui.app",
])
def test_the_cli_core_deploy_and_the_dashboard_load_no_stand_in(statement):
    modules = loaded_modules(statement)
    # the CLI's package finds the dev commands' entry point (tpuq_dev.cli, when installed): never the stand-ins
    assert under(modules, *STAND_INS, "tpuq_dev.devstack", "tpuq_dev.faketpu") == []


def test_the_capacity_model_runs_without_http_ssh_or_dev_tooling():
    modules = loaded_modules("import tpuq_dev.capacitymodel.model, tpuq_dev.capacitymodel.scenario")
    assert under(modules, "tpuq_dev.devstack", "tpuq_dev.faketpu", "flask", "werkzeug", "paramiko", "requests") == []


def test_the_cli_finds_the_dev_commands_without_importing_the_local_stack():
    modules = loaded_modules("import tpuq.cli.app")
    assert "tpuq_dev.cli" in modules  # the entry point, found through package metadata
    assert under(modules, "tpuq_dev.devstack", "tpuq_dev.faketpu", "tpuq_dev.demo", *STAND_INS) == []


@pytest.mark.parametrize("module", ["tpuq_dev.simulate_cli", "tpuq_dev.cli", "tpuq.cli.console"])
def test_a_dev_command_module_imports_first_without_a_circle(module):
    """The dev commands import the CLI's console; the CLI package loads the dev commands only when `main` runs,
    so either may be imported first (before, importing tpuq_dev.simulate_cli first failed half-way)."""
    assert module in loaded_modules(f"import {module}")
