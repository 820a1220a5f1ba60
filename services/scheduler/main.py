"""Scheduler entry point (Cloud Run / Cloud Functions 2nd gen, HTTP target `handle`).

Pub/Sub push subscriptions post here; `tpuq.runtime.service` routes by path.
"""

from tpuq.scheduler.handlers import build_service
from tpuq.runtime.entrypoints import Entry

ENTRY = Entry(build_service)  # nothing happens at import: the first request reads the settings and builds the service


def handle(request):
    return ENTRY.handle(request)
