"""Janitor entry point (Cloud Functions 2nd gen / Cloud Run, HTTP target `handle`).

Pub/Sub pushes fleet events, attempt events and ticks here; `tpuq.runtime.service` routes by path.
"""

from tpuq.janitor.handlers import build_service
from tpuq.runtime.entrypoints import configure_logging

configure_logging()
SERVICE = build_service()  # builds the route table only; clients are created on first use


def handle(request):
    return SERVICE.dispatch(request)
