"""Failing notification destinations (issue 36 §3, "a failed destination shows in `tpuq fleet` and the dashboard"):
read, never written, here. The sender (tpuq.janitor.notify) keeps one `notify_destinations/{label}` document per
destination (tpuq.contracts.notify.DestinationHealth), `failing` from a given-up delivery until the next success.
`failing_destinations` reads them; `failing_line` is what `tpuq fleet` prints and the dashboard's Fleet page shows
(pure). Labels are secret names, errors are "HTTP 500": neither carries a webhook URL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from tpuq.contracts import store
from tpuq.contracts.notify import DestinationHealth


def health_of(doc_id: str, doc: dict[str, Any]) -> DestinationHealth | None:
    """The stored document as a DestinationHealth; fields this reader does not know (a newer sender's) are left
    out, and a document that does not read at all is None (one bad document never hides the others)."""
    known = {k: v for k, v in doc.items() if k in DestinationHealth.model_fields}
    try:
        return DestinationHealth.model_validate({"label": doc_id, **known})
    except ValidationError:
        return None


def failing_destinations(db) -> list[DestinationHealth]:
    """The destinations whose last delivery was given up, by label."""
    found = [health_of(s.id, s.to_dict() or {}) for s in db.collection(store.NOTIFY_DESTINATIONS).stream()]
    return sorted((h for h in found if h and h.failing), key=lambda h: h.label)


def failing_line(health: DestinationHealth, now: datetime) -> str:
    """`notify: slack-alerts failing since 12m ago: HTTP 500 (event failed:train-3)`."""
    from tpuq.operations.queries import age

    since = f" since {age(health.last_failure_at, now)} ago" if health.last_failure_at else ""
    error = f": {health.last_error}" if health.last_error else ""
    event = f" (event {health.failed_event_id})" if health.failed_event_id else ""
    return f"notify: {health.label} failing{since}{error}{event}"


def failing_view(db, now: datetime) -> list[dict[str, Any]]:
    """What `tpuq fleet --json` and the dashboard hold of them: each failing destination's fields and its line."""
    return [health.model_dump(mode="json") | {"line": failing_line(health, now)} for health in failing_destinations(db)]
