"""Serving a service from the installed package.

Each service's entry module is `tpuq.<service>.main` (services/<service>/main.py): it builds that service's route
table and exposes `handle`, the functions-framework target. Everything that starts a service runs
`python -m tpuq.runtime.entrypoints <service>` (`tpuq_dev.devstack.stack.service_argv`): the local stack,
`tpuq demo`, and each Dockerfile's CMD. A wheel, a pipx or `uv tool` install and a container have no source tree,
so this finds the installed module, never a path under the repository.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

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


if TYPE_CHECKING:
    from tpuq.runtime.service import Service
    from tpuq.runtime.settings import Settings


class Entry:
    """A service's entry module's one object (`ENTRY = Entry(build_service)`; `handle` calls it). Nothing happens
    when functions-framework loads the module: the first request reads the settings once (`Settings.from_env`),
    sets up logging from them and builds the service; every later request is served by that one service. Tests and
    tools hand it a service they built with their own clients (`use`)."""

    def __init__(self, build: Callable[["Settings"], "Service"]):
        self._build = build
        self._service: Service | None = None
        self._lock = threading.Lock()

    def service(self) -> "Service":
        if self._service is None:
            with self._lock:
                if self._service is None:
                    from tpuq.runtime import logs
                    from tpuq.runtime.settings import Settings

                    settings = Settings.from_env()
                    logs.setup(env=settings.env)  # JSON lines for Cloud Logging on Cloud Run, readable text locally
                    self._service = self._build(settings)
        return self._service

    def use(self, service: "Service") -> None:
        self._service = service

    def handle(self, request):
        return self.service().dispatch(request)
