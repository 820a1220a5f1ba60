"""Core (pure): delivering one notification to one destination. The shell is tpuq.janitor.notify.

One record per (event id, destination) in `notifications/{record_id}` says where the delivery stands:
- `claim(record, now, policy)`: whether this handler may POST now. It may when nothing is recorded, or the last
  try failed and its `next_try_at` has come, and no other handler holds the lease (a POST in flight: two
  concurrent deliveries of the same message POST once). Delivered or given up: nothing to do.
- `after_post(record, result, now, policy)`: the record after the POST, whether Pub/Sub should deliver the
  message again (the handler answers non-2xx) and the destination's health. 2xx: delivered. 429, 5xx, no answer,
  no connection: tried again at `next_try_at` (Retry-After when the receiver gave one, else exponential
  backoff), until `policy.max_tries` tries or `policy.max_age` since the first: then given up. Another 4xx, or a
  secret that does not exist: given up at once (sending again would get the same answer).
- `body_for(notification, fmt)`: what is POSTed, per webhook format.

Nothing here sees a URL: records and errors name the destination's label (its secret).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Mapping

from tpuq.contracts import store
from tpuq.contracts.notify import DestinationHealth, Notification, WebhookFormat

DISCORD_MAX = 2000  # Discord's message content: at most 2,000 characters (discord.com/developers/docs/resources/message)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"


@dataclass(frozen=True)
class NotifyPolicy:
    """How hard one destination is tried. Pub/Sub redelivers the message (janitor-notifications: 10 s to 10 min
    apart, 60 deliveries); these bound it per destination."""

    timeout_seconds: float = 10.0  # one POST
    lease_seconds: float = 30.0  # a claimed POST is another handler's for this long (more than one POST's timeout)
    max_tries: int = 10
    max_age: timedelta = timedelta(hours=6)  # since the first try
    backoff_seconds: float = 10.0  # the first wait without Retry-After, doubling
    max_backoff_seconds: float = 600.0
    max_retry_after_seconds: float = 3600.0  # a Retry-After longer than this is capped

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "NotifyPolicy":
        """TPUQ_NOTIFY_TIMEOUT_SECONDS, TPUQ_NOTIFY_MAX_TRIES, TPUQ_NOTIFY_BACKOFF_SECONDS (the local stack's tests
        shorten them); unset: the defaults."""
        policy = cls()
        if env.get("TPUQ_NOTIFY_TIMEOUT_SECONDS"):
            policy = replace(policy, timeout_seconds=float(env["TPUQ_NOTIFY_TIMEOUT_SECONDS"]))
        if env.get("TPUQ_NOTIFY_MAX_TRIES"):
            policy = replace(policy, max_tries=max(1, int(env["TPUQ_NOTIFY_MAX_TRIES"])))
        if env.get("TPUQ_NOTIFY_BACKOFF_SECONDS"):
            policy = replace(policy, backoff_seconds=float(env["TPUQ_NOTIFY_BACKOFF_SECONDS"]))
        return replace(policy, lease_seconds=max(policy.lease_seconds, policy.timeout_seconds * 3))


def record_id(event_id: str, label: str) -> str:
    """notifications/{id}: one per (event, destination); a hash, as an event id may be long and hold any character."""
    return store.doc_id(hashlib.sha256(f"{event_id}\n{label}".encode()).hexdigest()[:40])


@dataclass(frozen=True)
class Claim:
    post: bool  # this handler POSTs now, having written `record`
    done: bool = False  # delivered or given up: nothing to do, acknowledge
    record: dict | None = None  # the record to write (guarded) before the POST
    wait_seconds: float = 0.0  # not now: the message is to come back (another handler's lease, next_try_at)
    why: str = ""


def claim(record: dict | None, now: datetime, policy: NotifyPolicy, event_id: str, label: str) -> Claim:
    record = dict(record or {})
    state = record.get("state")
    if state in (DELIVERED, FAILED):
        return Claim(False, done=True, why=f"already {state}")
    lease = record.get("lease_until")
    if state == SENDING and lease is not None and lease > now:
        return Claim(False, wait_seconds=(lease - now).total_seconds(), why="another delivery is posting it now")
    next_try = record.get("next_try_at")
    if next_try is not None and next_try > now:
        return Claim(False, wait_seconds=(next_try - now).total_seconds(), why="its next try is not due yet")
    fields = {**record, "event_id": event_id, "destination": label, "state": SENDING,
              "lease_until": now + timedelta(seconds=policy.lease_seconds), "updated_at": now}
    fields.setdefault("tries", 0)
    fields.setdefault("first_try_at", now)
    return Claim(True, record=fields)


@dataclass(frozen=True)
class PostResult:
    """What one POST got: an HTTP status, or no answer (`error`: "no answer in 10s", "could not connect")."""

    status: int | None = None
    retry_after: str | None = None  # the Retry-After header, as sent
    error: str | None = None

    @property
    def describe(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else (self.error or "no answer")


@dataclass(frozen=True)
class Outcome:
    record: dict
    retry: bool  # answer non-2xx so that Pub/Sub delivers the message again
    wait_seconds: float = 0.0
    health: dict | None = None  # notify_destinations/{id} fields to merge (None: unchanged)


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Retry-After (RFC 9110 10.2.3): delay-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, (when - now).total_seconds())


def after_post(record: dict, result: PostResult, now: datetime, policy: NotifyPolicy) -> Outcome:
    tries = int(record.get("tries") or 0) + 1
    base = {**record, "tries": tries, "lease_until": None, "last_try_at": now, "updated_at": now}
    label, event_id = record.get("destination", ""), record.get("event_id", "")
    if result.status is not None and 200 <= result.status < 300:
        return Outcome({**base, "state": DELIVERED, "delivered_at": now, "next_try_at": None,
                        "last_status": result.status}, False,
                       health={"label": label, "failing": False, "last_ok_at": now})
    error = result.describe
    transient = result.status is None or result.status == 429 or result.status >= 500
    first = record.get("first_try_at") or now
    if transient and tries < policy.max_tries and now - first < policy.max_age:
        wait = retry_after_seconds(result.retry_after, now)
        if wait is None:
            wait = policy.backoff_seconds * 2 ** (tries - 1)
            wait = min(wait, policy.max_backoff_seconds)
        wait = min(wait, policy.max_retry_after_seconds)
        return Outcome({**base, "state": PENDING, "last_error": error, "last_status": result.status,
                        "next_try_at": now + timedelta(seconds=wait)}, True, wait,
                       health={"label": label, "last_error": error, "last_failure_at": now})
    why = error if not transient else f"{error}, {tries} tries: given up"
    return give_up(base, why, now, event_id, label, result.status)


def give_up(record: dict, why: str, now: datetime, event_id: str, label: str, status: int | None = None) -> Outcome:
    return Outcome({**record, "event_id": event_id, "destination": label, "state": FAILED, "lease_until": None,
                    "next_try_at": None, "last_error": why, "last_status": status, "failed_at": now,
                    "updated_at": now}, False,
                   health=DestinationHealth(label=label, failing=True, last_error=why, last_failure_at=now,
                                            failed_event_id=event_id).model_dump(exclude={"last_ok_at"}))


def message_text(n: Notification) -> str:
    """The notification as chat text: the title, the text, the facts, the failing worker's last lines."""
    parts = [n.title]
    if n.text:
        parts.append(n.text)
    if n.fields:
        parts.append("\n".join(f"{k}: {v}" for k, v in n.fields.items()))
    if n.lines:
        parts.append("```\n" + "\n".join(n.lines) + "\n```")
    return "\n".join(parts)


def body_for(n: Notification, fmt: WebhookFormat) -> dict[str, Any]:
    if fmt == WebhookFormat.json:
        return {"id": n.event_id, **n.model_dump(mode="json")}
    text = message_text(n)
    if fmt == WebhookFormat.discord:
        if len(text) > DISCORD_MAX:
            text = text[:DISCORD_MAX - 1] + "…"
        return {"content": text}
    return {"text": text}  # slack, google_chat
