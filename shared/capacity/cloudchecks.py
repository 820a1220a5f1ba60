"""Shell: read the pre-checks' inputs (Cloud Quotas, Cloud Billing) over REST, behind a TTL cache.

`PrecheckReader(session, quotas_url, billing_url)` does one GET per quota ID the fleet needs and one for billing;
`PrecheckCache(reader, ttl)` keeps each fleet's answer for `ttl` seconds of the time it is given (the claimer's
clock). Every failure (HTTP error, unreachable, bad body) becomes one line in the result, never an exception:
a pre-check that fails never stops the claimer (tpuq.capacity.quota falls back to the declared quota).

Production: `https://cloudquotas.googleapis.com/v1/` and `https://cloudbilling.googleapis.com/v1/` with
google-auth's AuthorizedSession. Locally the fake's Google APIs server, named by TPUQ_CLOUDQUOTAS_API_ENDPOINT
and TPUQ_CLOUDBILLING_API_ENDPOINT (`tpuq dev env`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable

from tpuq.contracts.fleet import FleetFile
from tpuq.capacity.quota import (
    BillingState,
    Prechecks,
    QuotaInfoError,
    QuotaReading,
    effective_quota,
    parse_billing_info,
    parse_quota_info,
    quota_info_name,
    wanted_quota_ids,
)

CLOUDQUOTAS_URL = "https://cloudquotas.googleapis.com/"
CLOUDBILLING_URL = "https://cloudbilling.googleapis.com/"
PRECHECK_TTL_SECONDS = 300.0  # quota and billing change by a person's hand, rarely: re-read every 5 minutes
REQUEST_TIMEOUT_SECONDS = 10.0


def _error_line(response) -> str:
    try:
        err = response.json().get("error", {})
        message = err.get("message") or response.text
        status = err.get("status") or ""
    except ValueError:
        message, status = response.text, ""
    text = " ".join(str(message).split())[:200]
    return f"HTTP {response.status_code}{' ' + status if status else ''}: {text}"


@dataclass
class PrecheckReader:
    session: Any  # requests.Session-like: .get(url, timeout=...)
    quotas_url: str = CLOUDQUOTAS_URL
    billing_url: str = CLOUDBILLING_URL

    def _get(self, url: str) -> tuple[dict | None, str | None]:
        try:
            response = self.session.get(url, timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as e:  # unreachable, DNS, TLS, credentials: all mean "could not read"
            return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if response.status_code >= 400:
            return None, _error_line(response)
        try:
            body = response.json()
        except ValueError:
            return None, "the answer is not JSON"
        return (body, None) if isinstance(body, dict) else (None, "the answer is not a JSON object")

    def quota(self, project: str, quota_id: str) -> QuotaReading:
        body, error = self._get(_join(self.quotas_url, "v1/" + quota_info_name(project, quota_id)))
        if body is None:
            return QuotaReading(quota_id, error=error)
        try:
            return QuotaReading(quota_id, limits=parse_quota_info(body))
        except QuotaInfoError as e:
            return QuotaReading(quota_id, error=f"unexpected answer: {e}")

    def billing(self, project: str) -> BillingState:
        body, error = self._get(_join(self.billing_url, f"v1/projects/{project}/billingInfo"))
        if body is None:
            return BillingState(None, error)
        return parse_billing_info(body)

    def read(self, fleet: FleetFile, now: datetime) -> Prechecks:
        readings = {qid: self.quota(fleet.project, qid) for qid in wanted_quota_ids(fleet)}
        return Prechecks(effective_quota(fleet, readings), self.billing(fleet.project), read_at=now)


def _join(base: str, path: str) -> str:
    return (base if base.endswith("/") else base + "/") + path


@dataclass
class PrecheckCache:
    """Each fleet's pre-checks, re-read once `ttl_seconds` have passed (by the clock passed in) or the file changed."""

    reader: PrecheckReader
    ttl_seconds: float = PRECHECK_TTL_SECONDS
    _entries: dict[str, tuple[str, datetime, Prechecks]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, fleet: FleetFile, now: datetime, fresh: bool = False) -> Prechecks:
        """`fresh`: read again whatever the cache holds (the claimer asks while the fleet is blocked, so that a
        block whose cause is gone clears at the next message)."""
        key, version = fleet.name, fleet.version
        with self._lock:
            cached = self._entries.get(key)
        # Billing found off is read again on every message: a person who enabled it and ran `tpuq fleet unblock`
        # must not be blocked again by a stale answer.
        if not fresh and cached and cached[0] == version and now - cached[1] < timedelta(seconds=self.ttl_seconds) \
                and not cached[2].billing.disabled:
            return cached[2]
        prechecks = self.reader.read(fleet, now)
        with self._lock:
            self._entries[key] = (version, now, prechecks)
        return prechecks


def reader_from_settings(settings) -> PrecheckReader | None:
    """The reader for these Settings: the local endpoints when set (no credentials), else Google's with ADC.

    None on emulators without those endpoints (a local stack with no fake TPU): there is nothing to read, and
    the declared quota is all there is."""
    if settings.quotas_endpoint or settings.billing_endpoint:
        import requests

        return PrecheckReader(requests.Session(), settings.quotas_endpoint or CLOUDQUOTAS_URL,
                              settings.billing_endpoint or CLOUDBILLING_URL)
    if settings.firestore_emulator:
        return None
    return PrecheckReader(_LazyAuthorizedSession())


def cache_from_settings(settings, ttl_seconds: float = PRECHECK_TTL_SECONDS) -> PrecheckCache | None:
    reader = reader_from_settings(settings)
    return PrecheckCache(reader, ttl_seconds) if reader else None


class _LazyAuthorizedSession:
    """google-auth's AuthorizedSession, made on the first request (nothing connects or reads ADC before)."""

    def __init__(self, factory: Callable[[], Any] | None = None):
        self._factory = factory
        self._session = None
        self._failed: Exception | None = None  # no credentials: said once per process, not probed per read

    def get(self, url: str, **kw):
        if self._failed is not None:
            raise self._failed
        if self._session is None:
            if self._factory is not None:
                self._session = self._factory()
            else:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                try:
                    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
                except Exception as e:
                    self._failed = e
                    raise
                self._session = AuthorizedSession(credentials)
        return self._session.get(url, **kw)
