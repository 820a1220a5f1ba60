"""Joins the modules of tpuq.executor.worker into the one file the executor copies to each worker.

The worker runs that file as a plain module (gcslayout.WORKER_SUPERVISOR, imported by
worker.control.BOOTSTRAP so that its bytecode is cached in __pycache__), so the
bundle is ordinary Python source: the modules' bodies in import order, their
relative imports dropped, their standard-library imports hoisted to the top.
That only works when the modules keep to three rules, checked here at build
time (a test builds the bundle, so a broken rule fails the suite, not a worker):

- modules import each other as `from .module import name` only (no aliases, no
  `from . import module`): the bundle has no modules to import;
- no two modules bind the same top-level name (they share one namespace);
- the relative imports form no cycle.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources

WORKER_PACKAGE = "tpuq.executor.worker"
ENTRY_MODULE = "main"
SHEBANG = "#!/usr/bin/python3\n"


class BundleError(Exception):
    """The worker modules break a rule that joining them into one file relies on."""


@functools.lru_cache(maxsize=1)
def build_supervisor_script() -> bytes:
    """The bundle's source, built once per process from the installed worker package."""
    package = resources.files(WORKER_PACKAGE)
    init = package.joinpath("__init__.py").read_text()
    modules = {
        entry.name.removesuffix(".py"): entry.read_text()
        for entry in package.iterdir()
        if entry.name.endswith(".py") and entry.name != "__init__.py"
    }
    return join_modules(ast.get_docstring(ast.parse(init)) or "", modules).encode()


def join_modules(docstring: str, modules: dict[str, str]) -> str:
    """One source file from `modules` (name -> source), headed by `docstring`."""
    parsed = {name: _ParsedModule(name, source) for name, source in modules.items()}
    owners: dict[str, str] = {}
    for name, module in sorted(parsed.items()):
        for bound in module.defines:
            if bound in owners:
                raise BundleError(f"worker modules {owners[bound]} and {name} both define {bound!r}")
            owners[bound] = name
    hoisted: dict[str, str] = {}  # import statement -> the module it first appeared in
    for name, module in sorted(parsed.items()):
        for statement, bound_names in module.imports:
            for bound in bound_names:
                if bound in owners:
                    raise BundleError(f"worker module {name} imports {bound!r}, which {owners[bound]} defines")
            hoisted.setdefault(statement, name)
        for source_module, imported in module.relative_imports:
            if source_module not in parsed:
                raise BundleError(f"worker module {name} imports from .{source_module}, which does not exist")
            for bound in imported:
                if owners.get(bound) != source_module:
                    raise BundleError(f"worker module {name} imports {bound!r} from .{source_module}, which does not define it")

    if '"""' in docstring or "\\" in docstring:
        raise BundleError('the worker package docstring must not contain triple quotes or backslashes')
    parts = [SHEBANG, '"""' + docstring + '\n"""\n\n', "from __future__ import annotations\n\n"]
    parts += [statement + "\n" for statement in sorted(hoisted)]
    for name in _import_order(parsed):
        parts.append(f"\n\n# {'-' * 75}\n# {name}.py\n\n")
        parts.append(parsed[name].body.strip("\n") + "\n")
    return "".join(parts)


class _ParsedModule:
    """One worker module split into its imports and the rest of its source (comments kept)."""

    def __init__(self, name: str, source: str):
        tree = ast.parse(source, filename=f"{name}.py")
        lines = source.splitlines(keepends=True)
        dropped: set[int] = set()  # 0-based line numbers left out of the body
        self.imports: list[tuple[str, list[str]]] = []
        self.relative_imports: list[tuple[str, list[str]]] = []
        self.defines: set[str] = set()
        for index, node in enumerate(tree.body):
            span = range(node.lineno - 1, node.end_lineno)
            if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                dropped.update(span)  # the module docstring
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                dropped.update(span)
            elif isinstance(node, ast.ImportFrom) and node.level:
                if node.level != 1 or not node.module or any(alias.asname for alias in node.names):
                    raise BundleError(f"worker module {name}: write relative imports as `from .module import name`")
                self.relative_imports.append((node.module, [alias.name for alias in node.names]))
                dropped.update(span)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                statement = " ".join("".join(lines[i] for i in span).split())
                bound = [(alias.asname or alias.name).split(".")[0] for alias in node.names]
                self.imports.append((statement, bound))
                dropped.update(span)
            else:
                self.defines.update(_bound_names(node))
        self.depends_on = sorted({module for module, _ in self.relative_imports})
        self.body = "".join(line for i, line in enumerate(lines) if i not in dropped)


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
    return names


def _import_order(parsed: dict[str, _ParsedModule]) -> list[str]:
    """Each module after the modules it imports from; `main` last, as its `__main__` guard runs it.

    Alphabetical among equals, so that the bundle is the same on every build.
    """
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(parsed):
        ready = [name for name in sorted(parsed, key=lambda n: (n == ENTRY_MODULE, n)) if name not in placed
                 and all(dep in placed for dep in parsed[name].depends_on)]
        if not ready:
            cycle = sorted(set(parsed) - placed)
            raise BundleError(f"worker modules import each other in a cycle: {', '.join(cycle)}")
        order.append(ready[0])
        placed.add(ready[0])
    return order
