"""The import graph of the tpuq package runs one way (issue 33 §3): no arrow from a lower layer to a higher one, no
circle. The layers, bottom up (docs/ARCHITECTURE.md, "Where things live"):

- shared/: the contracts (tpuq.contracts) import nothing else of tpuq; the runtime (tpuq.runtime) and the capacity
  checks (tpuq.capacity) import only shared/;
- the services (services/<name>/: scheduler, claimer, executor, janitor) import shared/ and no other service;
- the client layer (operations/, tpuq.operations) imports no service and no front end;
- the front ends: deploy (tpuq.deploy), the dashboard (services/ui/, tpuq.ui) and the CLI (tpuq.cli), which only
  the CLI imports.
- No import cycle among the modules of tpuq.

An arrow is every `import` / `from ... import` anywhere in a module, inside functions too: a function-level import
is a dependency all the same, only deferred. Left out: imports under `if TYPE_CHECKING:` (annotations only, never
run), and the parent packages Python loads on the way to a submodule (`from tpuq.cli.console import ...` is an
arrow to tpuq.cli.console, not to tpuq.cli). Read from the source files with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.layout import production_modules

FRONT_ENDS = ("tpuq.cli", "tpuq.ui", "tpuq.deploy")
CLIENT_LAYER = "tpuq.operations"
SERVICES = ("tpuq.scheduler", "tpuq.claimer", "tpuq.executor", "tpuq.janitor")
CONTRACTS = "tpuq.contracts"
SHARED = (CONTRACTS, "tpuq.runtime", "tpuq.capacity")


def modules() -> dict[str, Path]:
    return production_modules()


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every import statement, at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The tpuq module an imported name lives in (its longest known prefix), or None outside tpuq."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def arrows(importer: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for each tpuq module this one imports."""
    is_package = path.name == "__init__.py"
    found = []
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = importer.split(".") if is_package else importer.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            # `from pkg import sub` imports the submodule pkg.sub; `from mod import name` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            module = _known(target, known)
            if module and module != importer and (node.lineno, module) not in found:
                found.append((node.lineno, module))
    return found


def graph() -> dict[str, list[tuple[int, str]]]:
    known = modules()
    return {name: arrows(name, path, known) for name, path in known.items()}


def where(importer: str, line: int, imported: str) -> str:
    return f"{importer}:{line} imports {imported}"


def upward_imports(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Every arrow that breaks one of the layer rules in the module's docstring."""
    wrong = []
    for importer, found in edges.items():
        for line, imported in found:
            if within(imported, "tpuq.cli") and not within(importer, "tpuq.cli"):
                wrong.append(where(importer, line, imported) + ": only the CLI imports the CLI")
            elif within(importer, "tpuq.ui") and within(imported, "tpuq.deploy"):
                wrong.append(where(importer, line, imported) + ": the dashboard imports no deploy")
            elif within(importer, CONTRACTS) and not within(imported, CONTRACTS):
                wrong.append(where(importer, line, imported) + ": the contracts import only contracts")
            elif any(within(importer, s) for s in SHARED) and not any(within(imported, s) for s in SHARED):
                wrong.append(where(importer, line, imported) + ": shared/ imports only shared/")
            elif within(importer, CLIENT_LAYER) and any(within(imported, s) for s in SERVICES):
                wrong.append(where(importer, line, imported) + ": the client layer imports no service")
            elif within(importer, CLIENT_LAYER) and any(within(imported, f) for f in FRONT_ENDS):
                wrong.append(where(importer, line, imported) + ": the client layer imports no front end")
            for service in SERVICES:
                if not within(importer, service):
                    continue
                if any(within(imported, f) for f in (*FRONT_ENDS, CLIENT_LAYER)):
                    wrong.append(where(importer, line, imported) + ": a service imports no front end or client")
                elif any(within(imported, other) for other in SERVICES if other != service):
                    wrong.append(where(importer, line, imported) + ": a service imports no other service")
    return sorted(wrong)


def cycles(edges: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    successors = {m: sorted({t for _, t in found}) for m, found in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found_cycles = []
    for root in sorted(successors):
        if root in index:
            continue
        work = [(root, iter(successors[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found_cycles.append(sorted(component))
    return sorted(found_cycles)


def _cycle_arrows(component: list[str], edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    inside = set(component)
    return [where(m, line, t) for m in component for line, t in edges[m] if t in inside]


def test_the_rules_see_the_imports_they_forbid():
    edges = {
        "tpuq.ui.pages": [(3, "tpuq.cli.jobs")],
        "tpuq.scheduler.handlers": [(4, "tpuq.claimer.decide"), (5, "tpuq.operations.jobs"), (6, "tpuq.contracts.store")],
        "tpuq.operations.jobs": [(7, "tpuq.ui.app")],
        "tpuq.cli.jobs": [(8, "tpuq.operations.jobs"), (9, "tpuq.cli.console")],
        "tpuq.contracts.fleet": [(10, "tpuq.runtime.clients"), (11, "tpuq.contracts.tputypes")],
        "tpuq.runtime.clients": [(12, "tpuq.capacity.cloudchecks"), (13, "tpuq.operations.queries")],
        "tpuq.operations.queries": [(14, "tpuq.scheduler.plan"), (15, "tpuq.contracts.store")],
    }
    assert [w.split(":")[0] for w in upward_imports(edges)] == [
        "tpuq.contracts.fleet", "tpuq.operations.jobs", "tpuq.operations.queries", "tpuq.runtime.clients",
        "tpuq.scheduler.handlers", "tpuq.scheduler.handlers", "tpuq.ui.pages"]
    assert cycles({"a": [(1, "b")], "b": [(2, "c")], "c": [(3, "a")], "d": [(4, "a")]}) == [["a", "b", "c"]]


def test_function_level_imports_are_arrows_and_type_checking_ones_are_not(tmp_path):
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tpuq import b\n"
              "def f():\n    from tpuq import c\n")
    path = tmp_path / "a.py"
    path.write_text(source)
    known = {"tpuq": path, "tpuq.a": path, "tpuq.b": path, "tpuq.c": path}
    assert arrows("tpuq.a", path, known) == [(5, "tpuq.c")]


def test_no_arrow_runs_up_a_layer():
    wrong = upward_imports(graph())
    assert not wrong, "imports that run up a layer:\n" + "\n".join(wrong)


def test_no_import_cycle():
    edges = graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(_cycle_arrows(c, edges)) for c in found)


def shared_by_services(edges: dict[str, list[tuple[int, str]]]) -> dict[str, set[str]]:
    """{module of shared/ (a documents submodule counts as tpuq.contracts.documents): the services importing it}."""
    found: dict[str, set[str]] = {}
    for importer, arrows_of in edges.items():
        service = next((s for s in SERVICES if within(importer, s)), None)
        if service is None:
            continue
        for _, imported in arrows_of:
            if any(within(imported, s) for s in SHARED):
                name = "tpuq.contracts.documents" if within(imported, "tpuq.contracts.documents") else imported
                found.setdefault(name, set()).add(service.removeprefix("tpuq."))
    return found


def test_the_architecture_lists_what_the_services_share_as_the_imports_say():
    text = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("<!-- shared-by-services: begin -->")[1].split("<!-- shared-by-services: end -->")[0]
    listed = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`tpuq."):
            listed[cells[0].strip("`")] = {s.strip() for s in cells[1].split(",")}
    assert listed == shared_by_services(graph()), "docs/ARCHITECTURE.md, \"What the services share\""
