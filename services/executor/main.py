"""Executor entry point (Cloud Run, HTTP target `handle`): assignments, status-object events, ticks."""

from tpuq.executor.handlers import build_service
from tpuq.runtime.entrypoints import Entry

ENTRY = Entry(build_service)  # nothing happens at import: the first request reads the settings and builds the service


def handle(request):
    return ENTRY.handle(request)
