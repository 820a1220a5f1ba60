"""Each service's HTTP entry point, inside the package, so that an installed tpuq can serve it.

`tpuq.entrypoints.<service>` builds that service's route table and exposes `handle`, the functions-framework
target. Everything that starts a service runs `python -m tpuq.entrypoints <service>`
(`tpuq_dev.devstack.stack.service_argv`): the local stack, `tpuq demo`, and each Dockerfile's CMD. A wheel, a pipx
or `uv tool` install and a container have no source tree, so nothing here may look for `services/`;
`services/<name>/main.py` are thin files over these modules, kept where a reviewer looks for a service.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tpuq import topology

TARGET = "handle"  # the functions-framework target every entry module defines
SIGNATURE_TYPE = "http"


class UnknownService(ValueError):
    """A service name that tpuq.topology does not declare."""


def source_file(service: str) -> Path:
    """The installed file of `tpuq.entrypoints.<service>`, for functions-framework's `--source` (it takes a file)."""
    if service not in topology.SERVICES:
        raise UnknownService(f"unknown service {service!r}: one of {', '.join(topology.SERVICES)}")
    spec = importlib.util.find_spec(f"{__name__}.{service}")
    if spec is None or not spec.origin:
        raise UnknownService(f"service {service!r} has no entry module {__name__}.{service} in this install")
    return Path(spec.origin)


def functions_framework_args(service: str) -> list[str]:
    """The arguments of `python -m functions_framework` that serve `service` (host and port are the caller's)."""
    return ["--source", str(source_file(service)), "--target", TARGET, "--signature-type", SIGNATURE_TYPE]


def configure_logging() -> None:
    """How every service logs; called once by each entry module, when functions-framework loads it:
    JSON lines for Cloud Logging on Cloud Run, readable text locally (tpuq.logs)."""
    from tpuq import logs

    logs.setup()
