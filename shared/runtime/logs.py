"""Log setup: one JSON object a line on Cloud Run, readable text locally; both carry the push's context.

On Cloud Run (`K_SERVICE` is set: Cloud Run sets it in every service's container) each record is one line
on stdout, a JSON object that Cloud Logging turns into a structured entry:
- `severity` (DEBUG | INFO | WARNING | ERROR | CRITICAL), so errors show as errors;
- `message`, with the traceback appended when there is one (Error Reporting reads it from there);
- `logger`, `time`, `logging.googleapis.com/sourceLocation`;
- `logging.googleapis.com/trace` when the request carried `X-Cloud-Trace-Context`, which groups a request's
  lines under its request log;
- whatever the log context holds: `service`, `subscription`, `message_id`, `job_id`, `attempt`, `node`.
  Cloud Logging keeps them as `jsonPayload.<field>`, so one filter follows a job through the four services
  (docs/DEPLOYING.md, "Following one job in Cloud Logging").

Locally the same records are text on stderr, with the context appended in brackets.

The context lives in a context variable: the handler adapter (tpuq.runtime.service) sets it for the length of one
push, so every line logged while handling it, in any module, carries it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
import contextvars
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import IO, Any

from tpuq.runtime.settings import ENV_CLOUD_RUN

CONTEXT_FIELDS = ("service", "subscription", "message_id", "job_id", "attempt", "node")
TRACE_FIELD = "logging.googleapis.com/trace"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_context: ContextVar[Mapping[str, Any]] = ContextVar("tpuq_log_context", default={})


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add fields (None ones are left out) to every record logged inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def submit_in_context(pool, fn, *args: Any):
    """`pool.submit(fn, *args)`, with fn run in a copy of the caller's log context.

    A thread pool's threads do not inherit context variables: without this, lines the executor logs from its
    SSH threads would lack the job, attempt and node of the push being handled."""
    return pool.submit(contextvars.copy_context().run, fn, *args)


def current_context() -> dict[str, Any]:
    return dict(_context.get())


def trace_resource(header: str | None, project: str | None) -> str | None:
    """`X-Cloud-Trace-Context: TRACE/SPAN;o=1` -> `projects/P/traces/TRACE`, the form Cloud Logging links."""
    trace = (header or "").split("/", 1)[0].strip()
    return f"projects/{project}/traces/{trace}" if trace and project else None


def _severity(record: logging.LogRecord) -> str:
    if record.levelno >= logging.CRITICAL:
        return "CRITICAL"
    if record.levelno >= logging.ERROR:
        return "ERROR"
    if record.levelno >= logging.WARNING:
        return "WARNING"
    return "INFO" if record.levelno >= logging.INFO else "DEBUG"


class CloudLoggingFormatter(logging.Formatter):
    """One JSON object per record, in the shape Cloud Logging reads from a Cloud Run container's stdout."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        elif record.stack_info:
            message = f"{message}\n{record.stack_info}"
        entry: dict[str, Any] = {
            "severity": _severity(record),
            "message": message,
            "logger": record.name,
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat().replace("+00:00", "Z"),
            "logging.googleapis.com/sourceLocation": {"file": record.pathname, "line": str(record.lineno),
                                                      "function": record.funcName},
        }
        entry.update(_context.get())
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The local format, with the push's context (not the trace) appended: `... [job_id=j attempt=2]`."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(f"{k}={v}" for k, v in _context.get().items() if k in CONTEXT_FIELDS)
        if not context:
            return text
        first, newline, rest = text.partition("\n")  # after the message, before a traceback
        return f"{first} [{context}]{newline}{rest}"


def on_cloud_run(env: Mapping[str, str]) -> bool:
    return bool(env.get(ENV_CLOUD_RUN))


def make_handler(env: Mapping[str, str], stream: IO[str] | None = None) -> logging.Handler:
    """JSON lines on stdout on Cloud Run, text on stderr elsewhere."""
    cloud = on_cloud_run(env)
    handler = logging.StreamHandler(stream or (sys.stdout if cloud else sys.stderr))
    handler.setFormatter(CloudLoggingFormatter() if cloud else TextFormatter())
    handler._tpuq = True  # type: ignore[attr-defined]  # ours: a second setup replaces it
    return handler


def setup(*, env: Mapping[str, str], level: int = logging.INFO, stream: IO[str] | None = None) -> None:
    """Give the root logger our handler, once, at a process's start.

    Like logging.basicConfig, it leaves a root logger that someone else configured alone (pytest's
    capture, an embedding server): their handlers decide where records go.
    """
    root = logging.getLogger()
    if any(not getattr(h, "_tpuq", False) for h in root.handlers):
        return
    for ours in list(root.handlers):
        root.removeHandler(ours)
    root.addHandler(make_handler(env, stream))
    root.setLevel(level)
