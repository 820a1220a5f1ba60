"""Settings are read once, into one object; nothing is read at import time (issue 33 §5).

A service's modules never read the environment: the entry module's first request reads `Settings.from_env()` once
and the service is built with it (tpuq.runtime.entrypoints.Entry). Only tpuq.runtime.settings reads variables, and
tpuq.runtime.clients, which sets the emulator hosts around a Google client's construction.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import timedelta

import pytest

from tests.layout import REPO, production_modules
from tpuq.runtime.settings import Settings, SettingsError

SERVICES = ("tpuq.claimer", "tpuq.scheduler", "tpuq.executor", "tpuq.janitor")
WORKER_PROGRAM = "tpuq.executor.worker"  # a stdlib program run on the TPU hosts, with its own environment
ALLOWED = {"tpuq.runtime.settings", "tpuq.runtime.clients"}


def environment_reads(source: str) -> list[int]:
    """Lines that read the process environment: os.environ, os.getenv, os.environ.get(...)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            lines.append(node.lineno)
    return sorted(set(lines))


def module_level_statements(source: str) -> list[ast.stmt]:
    return [n for n in ast.parse(source).body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.ClassDef))]


def test_the_scan_sees_environment_reads():
    assert environment_reads("import os\nx = os.environ.get('A')\ndef f():\n    return os.getenv('B')\n") == [2, 4]


def test_no_service_or_shared_module_reads_the_environment():
    offenders = []
    for module, path in production_modules().items():
        shared_or_service = module.startswith(("tpuq.contracts", "tpuq.runtime", "tpuq.capacity", *SERVICES))
        if not shared_or_service or module in ALLOWED or module.startswith(WORKER_PROGRAM):
            continue
        offenders += [f"{path.relative_to(REPO)}:{line}" for line in environment_reads(path.read_text())]
    assert offenders == [], "read it from the Settings passed in (ctx.settings):\n" + "\n".join(offenders)


def test_no_production_module_reads_the_environment_at_import():
    offenders = []
    for module, path in production_modules().items():
        if module.endswith("__main__") or module.startswith(WORKER_PROGRAM):
            continue  # a script's top level is its run
        for statement in module_level_statements(path.read_text()):
            lines = environment_reads(ast.unparse(statement))
            if lines:
                offenders.append(f"{path.relative_to(REPO)}:{statement.lineno}")
    assert offenders == []


@pytest.mark.parametrize("service", ["claimer", "scheduler", "executor", "janitor"])
def test_importing_a_service_entry_module_builds_nothing(service):
    """functions-framework loads the entry module at start: no setting is read (a bad one would refuse) and no
    service is built until the first request."""
    probe = f"import tpuq.{service}.main as m; print(m.ENTRY._service is None)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "TPUQ_EXECUTOR_PROBE_SECONDS": "not a number"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_settings_are_read_once_from_the_given_environment():
    settings = Settings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "TPUQ_FLEET": "f", "TPUQ_EXECUTOR_KEEP_SSH": "0",
                                  "TPUQ_EXECUTOR_PROBE_SECONDS": "2", "TPUQ_JANITOR_ORPHAN_SCAN_SECONDS": "30",
                                  "TPUQ_REPUBLISH_ASSIGNMENT_SECONDS": "45", "K_SERVICE": "tpuq-janitor",
                                  "TPUQ_BACKSTOP_SECONDS": "10", "TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS": "5",
                                  "TPUQ_WORKER_SERVICE_ACCOUNT": "w@p.iam.gserviceaccount.com"})
    assert (settings.project, settings.fleet, settings.executor_keep_ssh) == ("p", "f", False)
    assert settings.executor_probe_every == timedelta(seconds=2) and settings.orphan_scan_seconds == 30
    assert settings.republish_assignment_after == timedelta(seconds=45) and settings.on_cloud_run
    assert settings.worker_service_account == "w@p.iam.gserviceaccount.com"
    assert settings.backstop_every == timedelta(seconds=10) and Settings.from_env({}).backstop_seconds == 900
    assert settings.executor_failure_grace == timedelta(seconds=5)
    assert Settings.from_env({}).executor_failure_grace == timedelta(seconds=30)
    defaults = Settings.from_env({})
    assert (defaults.project, defaults.fleet, defaults.executor_keep_ssh, defaults.orphan_scan_seconds) == \
        ("tpuq-local", None, True, 600.0)


@pytest.mark.parametrize("name, value", [("TPUQ_EXECUTOR_PROBE_SECONDS", "soon"),
                                         ("TPUQ_JANITOR_ORPHAN_SCAN_SECONDS", "-5"),
                                         ("TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS", "half a minute")])
def test_a_setting_that_does_not_parse_is_refused_by_name(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})
