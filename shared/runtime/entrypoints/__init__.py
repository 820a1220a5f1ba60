"""Serving a service from the installed package.

Each service's entry module is `tpuq.<service>.main` (services/<service>/main.py): it builds that service's route
table and exposes `handle`, the functions-framework target. Everything that starts a service runs
`python -m tpuq.runtime.entrypoints <service>` (`tpuq_dev.devstack.stack.service_argv`): the local stack,
`tpuq demo`, and each Dockerfile's CMD. A wheel, a pipx or `uv tool` install and a container have no source tree,
so this finds the installed module, never a path under the repository.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tpuq.contracts import topology

TARGET = "handle"  # the functions-framework target every entry module defines
SIGNATURE_TYPE = "http"


class UnknownService(ValueError):
    """A service name that tpuq.contracts.topology does not declare."""


def source_file(service: str) -> Path:
    """The installed file of `tpuq.<service>.main`, for functions-framework's `--source` (it takes a file)."""
    if service not in topology.SERVICES:
        raise UnknownService(f"unknown service {service!r}: one of {', '.join(topology.SERVICES)}")
    module = entry_module(service)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise UnknownService(f"service {service!r} has no entry module {module} in this install")
    return Path(spec.origin)


def entry_module(service: str) -> str:
    return f"tpuq.{service}.main"


def functions_framework_args(service: str) -> list[str]:
    """The arguments of `python -m functions_framework` that serve `service` (host and port are the caller's)."""
    return ["--source", str(source_file(service)), "--target", TARGET, "--signature-type", SIGNATURE_TYPE]


def configure_logging() -> None:
    """How every service logs; called once by each entry module, when functions-framework loads it:
    JSON lines for Cloud Logging on Cloud Run, readable text locally (tpuq.runtime.logs)."""
    from tpuq.runtime import logs

    logs.setup()
