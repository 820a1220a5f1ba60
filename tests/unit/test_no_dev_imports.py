"""Production code never imports dev tooling: tpuq.devstack, tpuq.faketpu and tpuq.demo stay out of deploy,
the services and the CLI's backend lookup. Only the dev tooling itself and the CLI's `dev`/`demo` command module
may import them, and that module only inside its command functions, so importing the CLI never loads them."""

from __future__ import annotations

import ast
from pathlib import Path

import tpuq

PACKAGE_ROOT = Path(tpuq.__file__).resolve().parent
DEV_TOOLING = ("tpuq.devstack", "tpuq.faketpu", "tpuq.demo")
DEV_TOOLING_ITSELF = ("devstack", "faketpu", "demo.py")
DEV_COMMANDS = Path("cli") / "dev.py"


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


def dev_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, inside a function) for every import of dev tooling in one file."""
    return dev_imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def dev_imports_in(source: str, importer: str, is_package: bool) -> list[tuple[int, str, bool]]:
    tree = ast.parse(source)
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for name in imported_modules(node, importer, is_package):
            if any(name == dev or name.startswith(dev + ".") for dev in DEV_TOOLING):
                found.append((node.lineno, name, in_function))
                break
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def production_files() -> list[Path]:
    return [p for p in sorted(PACKAGE_ROOT.rglob("*.py"))
            if p.relative_to(PACKAGE_ROOT).parts[0] not in DEV_TOOLING_ITSELF]


def test_no_module_outside_the_dev_tooling_imports_it():
    offenders = [f"{p.relative_to(PACKAGE_ROOT)}:{line} imports {name}"
                 for p in production_files() if p.relative_to(PACKAGE_ROOT) != DEV_COMMANDS
                 for line, name, _ in dev_imports(p)]
    assert offenders == []


def test_the_cli_dev_commands_import_dev_tooling_only_inside_their_functions():
    found = dev_imports(PACKAGE_ROOT / DEV_COMMANDS)
    assert found, "the dev/demo commands are expected in tpuq/cli/dev.py"
    at_module_level = [f"line {line}: {name}" for line, name, in_function in found if not in_function]
    assert at_module_level == []


def test_the_scan_sees_function_level_and_relative_imports():
    source = "import os\n\ndef later():\n    from .devstack import stack\n\nfrom tpuq import demo\n"
    assert dev_imports_in(source, "tpuq.some_service", is_package=False) == [
        (4, "tpuq.devstack", True), (6, "tpuq.demo", False)]
