"""The worker modules and the one file they are shipped as: Python 3.9, stdlib only, joined safely."""

from __future__ import annotations

import ast
import glob
import json
import re
import shutil
import subprocess
import sys
from importlib import resources

import pytest

from tpuq.executor.supervisor_bundle import BundleError, build_supervisor_script, join_modules

WORKER_PYTHON_VERSION = (3, 9)  # the oldest system python a worker may have


def _worker_modules() -> dict[str, str]:
    package = resources.files("tpuq.executor.worker")
    return {entry.name: entry.read_text() for entry in package.iterdir() if entry.name.endswith(".py")}


@pytest.mark.parametrize("name", sorted(_worker_modules()))
def test_each_worker_module_parses_as_python_3_9(name):
    ast.parse(_worker_modules()[name], filename=name, feature_version=WORKER_PYTHON_VERSION)


def test_the_bundle_parses_as_python_3_9():
    ast.parse(build_supervisor_script().decode(), feature_version=WORKER_PYTHON_VERSION)


@pytest.mark.parametrize("name", sorted(_worker_modules()))
def test_worker_modules_import_only_the_standard_library_and_each_other(name):
    outside = []
    for node in ast.walk(ast.parse(_worker_modules()[name])):
        if isinstance(node, ast.Import):
            outside += [a.name for a in node.names if a.name.split(".")[0] not in sys.stdlib_module_names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module.split(".")[0] not in sys.stdlib_module_names:
                outside.append(node.module)
    assert outside == []


def _python_3_9() -> str | None:
    """A Python 3.9 interpreter on this machine, if there is one that runs."""
    candidates = [shutil.which("python3.9"), *sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3.9"))]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 9)":
            return candidate
    return None


def test_the_bundle_runs_on_python_3_9(tmp_path):
    python = _python_3_9()
    if python is None:
        pytest.skip("no Python 3.9 interpreter here (the grammar check above still ran)")
    from tpuq.executor.worker.control import bootstrap_argv

    script = tmp_path / "supervisor.py"
    script.write_bytes(build_supervisor_script())
    out = subprocess.run(bootstrap_argv(python, str(script), "--home", str(tmp_path / "home"), "status"),
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["launched"] is False, out.stderr


def test_the_bundle_is_the_same_on_every_build():
    modules = {name.removesuffix(".py"): text for name, text in _worker_modules().items() if name != "__init__.py"}
    assert join_modules("doc", modules) == join_modules("doc", dict(reversed(list(modules.items()))))


@pytest.mark.parametrize(
    "modules, refusal",
    [
        ({"a": "X = 1\n", "b": "X = 2\n"}, "worker modules a and b both define 'X'"),
        ({"a": "def f(): pass\n", "b": "from .a import f as g\n"}, "write relative imports as `from .module import name`"),
        ({"a": "X = 1\n", "b": "from . import a\n"}, "write relative imports as `from .module import name`"),
        ({"a": "from .b import Y\nX = 1\n", "b": "from .a import X\nY = 1\n"}, "in a cycle: a, b"),
        ({"a": "X = 1\n", "b": "from .a import Z\n"}, "imports 'Z' from .a, which does not define it"),
        ({"b": "from .a import X\n"}, "imports from .a, which does not exist"),
        ({"a": "import os\n", "b": "os = None\n"}, "worker module a imports 'os', which b defines"),
    ],
)
def test_modules_that_cannot_share_one_namespace_are_refused(modules, refusal):
    with pytest.raises(BundleError, match=re.escape(refusal)):
        join_modules("doc", modules)


def test_joined_modules_run_in_import_order_with_the_entry_last():
    source = join_modules("doc", {
        "main": "import sys\nfrom .z import greet\n\nif __name__ == '__main__':\n    sys.stdout.write(greet())\n",
        "z": "from .a import NAME\n\n\ndef greet():\n    return 'hello ' + NAME\n",
        "a": "NAME = 'worker'\n",
    })
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=30)
    assert out.stdout == "hello worker", out.stderr


def test_the_supervisor_command_line_reads_what_the_executor_sends_and_refuses_the_rest(capsys):
    from tpuq.executor.worker.main import main, parse

    assert parse(["--home", "/h", "start", "--lock-wait", "12", "--attempt-id", "a-1"]) == \
        ("/h", "start", {"--lock-wait": "12", "--attempt-id": "a-1"})
    assert parse(["--home=/h", "cancel", "--attempt-id=a-1", "--reason", "user asked", "--grace", "0.5"]) == \
        ("/h", "cancel", {"--attempt-id": "a-1", "--reason": "user asked", "--grace": "0.5"})
    assert parse(["--home", "/h", "status"]) == ("/h", "status", {})
    for argv, why in [([], "a subcommand is required"), (["launch"], "launch requires --attempt-id"),
                      (["status", "--grace", "1"], "unexpected argument '--grace'"),
                      (["status", "--home", "/h"], "unexpected argument '--home'"),
                      (["cancel", "--attempt-id"], "--attempt-id needs a value"),
                      (["cancel", "--attempt-id", "a", "--grace", "soon"], "could not convert string to float")]:
        assert main(argv) == 2
        assert why in capsys.readouterr().err


def test_loading_the_bundle_leaves_the_slow_imports_to_where_they_are_used(tmp_path):
    """Every job's start loads the bundle first: argparse, urllib and traceback (a third of its import time) are
    imported only by what uses them (a download, an upload, a crash), not on the way to the job's start."""
    script = tmp_path / "supervisor.py"
    script.write_bytes(build_supervisor_script())
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import supervisor; "
             "print(sorted(m for m in ('argparse', 'urllib.parse', 'urllib.request', 'traceback') if m in sys.modules))")
    python = "/usr/bin/python3" if shutil.which("/usr/bin/python3") else sys.executable
    out = subprocess.run([python, "-I", "-S", "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
