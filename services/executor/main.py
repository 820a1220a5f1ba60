"""Executor entry point (Cloud Run, HTTP target `handle`): assignments, status-object events, ticks."""

from tpuq.executor.handlers import build_service
from tpuq.runtime.entrypoints import configure_logging

configure_logging()
SERVICE = build_service()  # the route table only; clients and SSH keys are loaded on first use


def handle(request):
    return SERVICE.dispatch(request)
