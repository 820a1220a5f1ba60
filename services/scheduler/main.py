"""Scheduler entry point (Cloud Run / Cloud Functions 2nd gen, HTTP target `handle`).

Pub/Sub push subscriptions post here; `tpuq.runtime.service` routes by path.
"""

from tpuq.scheduler.handlers import build_service
from tpuq.runtime.entrypoints import configure_logging

configure_logging()
SERVICE = build_service()  # builds the route table only; clients are created on first use


def handle(request):
    return SERVICE.dispatch(request)
