"""Janitor entry point (Cloud Functions 2nd gen / Cloud Run, HTTP target `handle`).

Pub/Sub pushes fleet events, attempt events and ticks here; `tpuq.runtime.service` routes by path.
"""

from tpuq.janitor.handlers import build_service
from tpuq.runtime.entrypoints import Entry

ENTRY = Entry(build_service)  # nothing happens at import: the first request reads the settings and builds the service


def handle(request):
    return ENTRY.handle(request)
