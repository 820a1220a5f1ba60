"""Executor entry point (Cloud Run, HTTP target `handle`): assignments, status-object events, ticks."""

from tpuq import logs
from tpuq.executor.handlers import build_service

logs.setup()  # JSON lines for Cloud Logging on Cloud Run, text locally
SERVICE = build_service()  # the route table only; clients and SSH keys are loaded on first use


def handle(request):
    return SERVICE.dispatch(request)
