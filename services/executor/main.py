"""Executor entry point (Cloud Run, HTTP target `handle`): assignments, status-object events, ticks."""

import logging

from tpuq.executor.handlers import build_service

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
SERVICE = build_service()  # the route table only; clients and SSH keys are loaded on first use


def handle(request):
    return SERVICE.dispatch(request)
