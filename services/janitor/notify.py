"""Shell: the janitor's /push/notifications handler delivers a Notification to each of its destinations.

Per destination (tpuq.janitor.notifydecide decides): claim `notifications/{record_id}` with a guarded write (two
concurrent deliveries of one message: one POSTs, the other answers non-2xx and finds it delivered next time),
read the webhook URL from Secret Manager (kept `URL_CACHE_SECONDS` in memory, never logged or stored), POST the
body with the policy's timeout, record the outcome and the destination's health
(`notify_destinations/{store.doc_id(label)}`, what `tpuq fleet` shows). A destination to try again makes the
handler raise `Retryable` once every destination had its turn, so Pub/Sub delivers the message again.

The URL is a credential: errors of `requests` name it, so what is recorded or logged is only the status or the
kind of failure, and any text that could carry it passes `redact` first.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tpuq.contracts import store
from tpuq.contracts.errors import Retryable
from tpuq.contracts.notify import Destination, Notification, format_for_url, masked_url
from tpuq.janitor import notifydecide as nd
from tpuq.runtime import guarded
from tpuq.runtime.secretmanager import SecretAccessDenied, SecretError, SecretManager, SecretNotFound

log = logging.getLogger("tpuq.janitor.notify")

URL_CACHE_SECONDS = 60.0  # a rotated webhook is used within a minute; a burst of events reads the secret once


def redact(text: str, url: str) -> str:
    return text.replace(url, masked_url(url)) if url else text


@dataclass
class Notifier:
    """The janitor's per-instance delivery state: the policy, Secret Manager, the URL cache, the HTTP POST."""

    policy: nd.NotifyPolicy
    secrets_factory: Callable[[], Any]  # () -> something with .access(secret) -> str (tpuq.runtime.secretmanager)
    post: Callable[..., Any] | None = None  # requests.post-like; None: requests.post
    monotonic: Callable[[], float] = time.monotonic
    _secrets: Any = None
    _cache: dict[str, tuple[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_settings(cls, settings: Any) -> "Notifier":
        return cls(nd.NotifyPolicy.from_env(settings.env), lambda: SecretManager.from_settings(settings))

    def url_of(self, secret: str) -> str:
        now = self.monotonic()
        with self._lock:
            cached = self._cache.get(secret)
            if cached and now - cached[1] < URL_CACHE_SECONDS:
                return cached[0]
            if self._secrets is None:
                self._secrets = self.secrets_factory()
        url = self._secrets.access(secret).strip()
        with self._lock:
            self._cache[secret] = (url, now)
        return url

    def send(self, url: str, body: dict) -> nd.PostResult:
        post = self.post
        if post is None:
            import requests

            post = requests.post
        try:
            response = post(url, json=body, timeout=self.policy.timeout_seconds,
                            headers={"User-Agent": "tpuq-notify"})
        except Exception as e:  # noqa: BLE001 - its text names the URL: only the kind of failure is kept
            kind = type(e).__name__
            if "Timeout" in kind:
                return nd.PostResult(error=f"no answer in {self.policy.timeout_seconds:g}s")
            if "Connection" in kind:
                return nd.PostResult(error=f"could not connect ({kind})")
            return nd.PostResult(error=redact(f"{kind}", url))
        return nd.PostResult(status=response.status_code, retry_after=response.headers.get("Retry-After"))


def deliver(n: Notification, ctx: Any, notifier: Notifier) -> None:
    """Every destination of `n`, each once; Retryable when one is to be tried again."""
    waits: list[str] = []
    for destination in n.destinations:
        try:
            outcome = deliver_one(n, destination, ctx, notifier)
        except Exception as e:  # noqa: BLE001 - one destination's trouble (Firestore, a bug) never stops the others
            log.exception("notification %s to %s", n.event_id, destination.label)
            outcome = f"{destination.label}: {type(e).__name__}"
        if outcome:
            waits.append(outcome)
    if waits:
        raise Retryable(f"notification {n.event_id}: " + "; ".join(waits))


def deliver_one(n: Notification, destination: Destination, ctx: Any, notifier: Notifier) -> str | None:
    """One destination; what is left to do (to say why the message must come back), or None."""
    db = ctx.clients.firestore
    label = destination.label
    ref = db.collection(store.NOTIFICATIONS).document(nd.record_id(n.event_id, label))
    snap = ref.get()
    decision = nd.claim(snap.to_dict() if snap.exists else None, ctx.now(), notifier.policy, n.event_id, label)
    if decision.done:
        return None
    if not decision.post:
        return f"{label}: {decision.why} ({decision.wait_seconds:.0f}s)"
    if not guarded.commit_if_unchanged(db, guarded.WriteSet().update(snap, decision.record)):
        return f"{label}: another delivery claimed it"
    record = decision.record
    try:
        url = notifier.url_of(destination.secret or "")
    except SecretNotFound:
        outcome = nd.give_up(record, f"secret {label} not found (or it has no version)", ctx.now(), n.event_id, label)
    except SecretAccessDenied:
        outcome = nd.after_post(record, nd.PostResult(error=f"may not read secret {label} (grant "
                                                           "roles/secretmanager.secretAccessor to the janitor)"),
                                ctx.now(), notifier.policy)
    except SecretError as e:
        outcome = nd.after_post(record, nd.PostResult(error=str(e)[:200]), ctx.now(), notifier.policy)
    else:
        fmt = destination.format or format_for_url(url)
        result = notifier.send(url, nd.body_for(n, fmt))
        outcome = nd.after_post(record, result, ctx.now(), notifier.policy)
        log.info("notification %s to %s (%s): %s", n.event_id, label, masked_url(url), result.describe)
    ref.set(outcome.record)
    if outcome.health:
        db.collection(store.NOTIFY_DESTINATIONS).document(store.doc_id(label)).set(outcome.health, merge=True)
    if outcome.record["state"] == nd.FAILED:
        log.warning("notification %s to %s given up: %s", n.event_id, label, outcome.record.get("last_error"))
    return f"{label}: {outcome.record.get('last_error')}, next try in {outcome.wait_seconds:.0f}s" \
        if outcome.retry else None
