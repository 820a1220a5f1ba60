"""The in-memory stand-ins are for tests and the simulator: no module of a service imports them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "tpuq"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_production_module_imports_tpuq_inmemory():
    sources = [p for p in PACKAGE.rglob("*.py")
               if PACKAGE / "inmemory" not in p.parents and PACKAGE / "simulate" not in p.parents]
    sources += list((REPO / "services").rglob("*.py"))
    offenders = sorted(str(p.relative_to(REPO)) for p in sources
                       if any(m == "tpuq.inmemory" or m.startswith("tpuq.inmemory.") for m in imported_modules(p)))
    assert len(sources) > 50 and offenders == []


def test_no_service_module_imports_the_simulator():
    sources = [p for p in PACKAGE.rglob("*.py") if PACKAGE / "simulate" not in p.parents
               and not str(p.relative_to(PACKAGE)).startswith("cli/")]
    sources += list((REPO / "services").rglob("*.py"))
    offenders = sorted(str(p.relative_to(REPO)) for p in sources
                       if any(m == "tpuq.simulate" or m.startswith("tpuq.simulate.") for m in imported_modules(p)))
    assert len(sources) > 50 and offenders == []
