"""The handler adapter: one place turns a Pub/Sub push (or a CloudEvent) into a model.

Every service is one HTTP entry point. A push subscription posts to a path that
`tpuq.contracts.topology` declares; the adapter decodes the envelope, validates the data
against the topic's model, and calls the handler with a `Context`.

Outcomes:
- handler returns                 -> 204, Pub/Sub acknowledges
- `Retryable` or unexpected error -> 503/500, Pub/Sub redelivers; after the
  subscription's max_delivery_attempts the message is dead-lettered and acked
  (so nothing loops forever, even on the emulator, which has no delivery count)
- invalid payload / `Permanent`   -> recorded in `dead_letters`, acked (200);
  if the payload names a job that does not exist yet, that job is stored as
  `rejected` with the reason
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from tpuq.contracts import store, topology
from tpuq.runtime.auth import PushAuth, PushAuthConfigError
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import JobDoc, JobState, parse_timestamp
from tpuq.contracts.errors import Permanent, Retryable, from_validation_error
from tpuq.runtime.logs import TRACE_FIELD, log_context, trace_resource

log = logging.getLogger("tpuq.runtime.service")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Context:
    """What a handler gets besides its message: clients, settings, the service's per-instance state, the clock,
    randomness, metadata."""

    clients: Clients
    now: Callable[[], datetime]
    rng: random.Random
    message_id: str
    attributes: dict[str, str]
    publish_time: datetime | None
    subscription: topology.Subscription
    service: str
    settings: Settings
    state: Any = None  # what the service's build_service made for its handlers (an SSH pool, caches, timers)

    def publish(self, topic: str, message: BaseModel | dict[str, Any], **attributes: str) -> str:
        return self.clients.publish(topic, message, **attributes)


Handler = Callable[[Any, Context], None]


@dataclass
class PushMessage:
    """A decoded Pub/Sub message, before validation."""

    message_id: str
    data: bytes
    attributes: dict[str, str]
    publish_time: datetime | None
    subscription: str | None
    delivery_attempt: int | None = None


class BadEnvelope(Exception):
    """The HTTP request is not a Pub/Sub push or CloudEvent at all."""


def decode_envelope(headers: dict[str, str], body: bytes) -> PushMessage:
    """Accept a raw push body, a structured CloudEvent or a binary-mode CloudEvent."""
    try:
        envelope = json.loads(body or b"")
    except ValueError as e:
        raise BadEnvelope(f"request body is not JSON: {e}") from None
    if not isinstance(envelope, dict):
        raise BadEnvelope("request body is not a JSON object")
    lower = {k.lower(): v for k, v in headers.items()}
    ce_id = lower.get("ce-id")
    if "specversion" in envelope and "data" in envelope:  # structured CloudEvent
        ce_id = envelope.get("id")
        envelope = envelope["data"] if isinstance(envelope["data"], dict) else {}
    message = envelope.get("message")
    if not isinstance(message, dict):
        raise BadEnvelope("envelope has no 'message' object")
    raw = message.get("data", "")
    if not isinstance(raw, str):
        raise BadEnvelope("message.data is not a base64 string")
    try:
        data = base64.b64decode(raw, validate=True) if raw else b""
    except (binascii.Error, ValueError):
        raise BadEnvelope("message.data is not base64") from None
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise BadEnvelope("message.attributes is not an object")
    attributes = {str(k): str(v) for k, v in attributes.items()}
    message_id = str(message.get("messageId") or message.get("message_id") or ce_id or "")
    if not message_id:
        raise BadEnvelope("message has no messageId")
    if not all(_is_text(t) for t in (message_id, *attributes, *attributes.values())):
        raise BadEnvelope("message id or attributes are not UTF-8 text")  # Pub/Sub sends only UTF-8
    attempt = envelope.get("deliveryAttempt")
    return PushMessage(
        message_id=message_id,
        data=data,
        attributes=attributes,
        publish_time=parse_timestamp(message.get("publishTime") or message.get("publish_time")),
        subscription=envelope.get("subscription"),
        delivery_attempt=_delivery_attempt(attempt),
    )


def _is_text(value: str) -> bool:
    """UTF-8 encodable: no lone surrogate (JSON's `\\ud800` decodes to one, and Firestore stores only UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8(value: str | None) -> str | None:
    """`value` with any lone surrogate replaced, so that a record of it can be stored."""
    return value if value is None or _is_text(value) else value.encode("utf-8", "replace").decode("utf-8")


def _delivery_attempt(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit():  # "²".isdigit() is True, int("²") fails
        return int(value)
    return None


def parse_payload(data: bytes) -> dict[str, Any]:
    """Bytes -> JSON object, or a Permanent error naming the reason."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Permanent("payload is not UTF-8 text", field="(message)") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise Permanent(f"payload is not JSON: {e.msg} at line {e.lineno} column {e.colno}", field="(message)") from None
    if not isinstance(value, dict):
        raise Permanent(f"payload is JSON but not an object (got {type(value).__name__})", field="(message)")
    return value


def job_id_in(payload: dict[str, Any] | None, topic_name: str) -> str | None:
    """The job a message names (its `job_id`, or on `jobs` its `id`), when Firestore would take it as an id: read
    from a payload before validation, here and from a dead-lettered message (tpuq.operations.heldletters)."""
    if not payload:
        return None
    candidate = payload.get("job_id") or (payload.get("id") if topic_name == "jobs" else None)
    # Only an id Firestore takes: `a/b` is a path to another document, `..` an error (the rejection would retry).
    ok = isinstance(candidate, str) and 0 < len(candidate) <= 63 and store.id_problem(candidate) is None
    return candidate if ok else None


def _job_fields(payload: dict[str, Any], topic_name: str) -> dict[str, Any]:
    """The job, attempt and node a message is about, read before validation so that a rejection carries them too."""
    attempt, node = payload.get("attempt"), payload.get("node")
    return {"job_id": job_id_in(payload, topic_name),
            "attempt": attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
            "node": node if isinstance(node, str) and node else None}


@dataclass
class Service:
    """One deployable service, built by its `build_service(settings, clients, ...)` with everything passed in: its
    route table (subscription path -> module-level `on_<topic>` handler), the settings read once, its clients (a
    `Clients` connects each client on first use; tests pass in-memory ones) and its per-instance state."""

    name: str
    routes: Mapping[str, Handler]
    settings: Settings
    clients: Clients
    state: Any = None
    now: Callable[[], datetime] = utcnow
    rng: random.Random = field(default_factory=random.Random)
    push_auth: PushAuth | None = None  # None: from the settings at the first request (tpuq.runtime.auth)

    # ---- HTTP entry point (functions-framework http target / Flask view) ----
    def dispatch(self, request) -> tuple[str, int]:
        """`request` is a Flask/werkzeug request."""
        trace = trace_resource(request.headers.get("X-Cloud-Trace-Context"), self.settings.project)
        with log_context(service=self.name, **{TRACE_FIELD: trace}):
            return self._dispatch(request)

    def _dispatch(self, request) -> tuple[str, int]:
        path = request.path
        if request.method == "GET" and path == "/":  # not /healthz: Cloud Run reserves paths ending in z
            return f"{self.name} ok", 200
        refused = self._refuse_unauthenticated(request)
        if refused:
            return refused
        sub = topology.subscription_by_path(self.name, path)
        if sub is None:
            return f"no handler for {path} on {self.name}", 404
        try:
            msg = decode_envelope(dict(request.headers), request.get_data())
        except BadEnvelope as e:
            # Not from Pub/Sub: nothing to redeliver, so a 400 cannot loop.
            log.warning("bad push envelope on %s: %s", path, e)
            return f"bad request: {e}", 400
        return self.deliver(sub, msg)

    def _refuse_unauthenticated(self, request) -> tuple[str, int] | None:
        try:
            if self.push_auth is None:
                self.push_auth = PushAuth.from_env(self.settings.env)
        except PushAuthConfigError as e:  # fail closed: a half-configured deployment accepts nothing
            log.error("%s: %s", self.name, e)
            return "push authentication is misconfigured", 500
        return self.push_auth.check(dict(request.headers), self.name)

    def deliver(self, sub: topology.Subscription, msg: PushMessage) -> tuple[str, int]:
        """Every line logged while handling the message carries its subscription, id and job (tpuq.runtime.logs)."""
        with log_context(service=self.name, subscription=sub.name, message_id=msg.message_id):
            try:
                payload = parse_payload(msg.data)
            except Permanent as e:
                return self._reject(sub, msg, None, e)
            with log_context(**_job_fields(payload, sub.topic)):
                return self._handle(sub, msg, payload)

    def _handle(self, sub: topology.Subscription, msg: PushMessage, payload: dict[str, Any]) -> tuple[str, int]:
        topic = topology.topic(sub.topic)
        handler = self.routes[sub.path]
        try:
            model = topic.model.model_validate(payload) if topic.model else payload
        except ValidationError as e:
            # The model that refused it: a misspelt field is then told which one it likely meant.
            model_of = getattr(topic.model, "model_of", None)
            return self._reject(sub, msg, payload,
                                from_validation_error(e, model=model_of(payload) if model_of else topic.model))
        except Permanent as e:
            return self._reject(sub, msg, payload, e)
        ctx = Context(
            clients=self.clients,
            now=self.now,
            rng=self.rng,
            message_id=msg.message_id,
            attributes=msg.attributes,
            publish_time=msg.publish_time,
            subscription=sub,
            service=self.name,
            settings=self.settings,
            state=self.state,
        )
        try:
            handler(model, ctx)
        except Permanent as e:
            return self._reject(sub, msg, payload, e)
        except Exception as e:  # noqa: BLE001 - every other failure is retried, but boundedly
            return self._failed(sub, msg, payload, e)
        return "", 204

    # ---- failure paths ----
    def _failed(self, sub, msg: PushMessage, payload, exc: Exception) -> tuple[str, int]:
        retryable = isinstance(exc, Retryable)
        if not retryable:
            log.exception("%s: handler failed on message %s", sub.name, msg.message_id)
        else:
            log.warning("%s: retryable failure on message %s: %s", sub.name, msg.message_id, exc)
        try:
            attempts = msg.delivery_attempt or self._count_failure(sub, msg)
        except Exception:  # noqa: BLE001 - the store itself is down: let Pub/Sub retry
            log.exception("could not count the failed delivery")
            return "retry", 503
        if attempts >= sub.max_delivery_attempts:
            reason = f"gave up after {attempts} failed deliveries: {type(exc).__name__}: {exc}"
            return self._reject(sub, msg, payload, Permanent(reason), kind="exhausted", mark_job=False)
        return ("retry", 503) if retryable else ("error", 500)

    def _count_failure(self, sub, msg: PushMessage) -> int:
        from google.cloud import firestore

        ref = self.clients.firestore.collection(store.DELIVERIES).document(store.doc_id(sub.name, msg.message_id))
        ref.set({"failures": firestore.Increment(1), "updated_at": self.now()}, merge=True)
        return int((ref.get().to_dict() or {}).get("failures", 1))

    def _reject(
        self,
        sub,
        msg: PushMessage,
        payload: dict[str, Any] | None,
        err: Permanent,
        kind: str = "invalid",
        mark_job: bool = True,
    ) -> tuple[str, int]:
        job_id = job_id_in(payload, sub.topic)
        reason = _utf8(str(err))  # a field or a reason may quote the payload, lone surrogates and all
        log.warning("%s: rejected message %s (%s): %s", sub.name, msg.message_id, err.field or "-", reason)
        record = {
            "message_id": msg.message_id,
            "subscription": sub.name,
            "topic": sub.topic,
            "service": self.name,
            "reason": reason,
            "field": _utf8(err.field),
            "raw_data": msg.data.decode("utf-8", errors="replace")[:100_000],
            "attributes": msg.attributes,
            "job_id": job_id,
            "recorded_at": self.now(),
            "kind": kind,
        }
        try:
            db = self.clients.firestore
            db.collection(store.DEAD_LETTERS).document(store.doc_id(sub.name, msg.message_id)).set(record)
            if job_id and mark_job and sub.topic == "jobs":
                _store_rejected_job(db, job_id, reason, _utf8(err.field), msg, self.now())
        except Exception:  # noqa: BLE001 - could not record: let Pub/Sub retry the whole thing
            log.exception("could not record the rejection of %s", msg.message_id)
            return "retry", 503
        return f"rejected: {reason}", 200


def _owner_or_none(attributes: dict[str, str]) -> str | None:
    """A rejected job keeps who submitted it when its message says so well (a malformed owner is left out)."""
    from tpuq.contracts.messages import message_owner

    try:
        return message_owner(attributes)
    except Permanent:
        return None


def _store_rejected_job(db, job_id: str, reason: str, field_name: str | None, msg: PushMessage, now: datetime) -> None:
    """Store the job as rejected, unless a job with that id is already stored: nothing stored is lost."""
    from google.api_core.exceptions import AlreadyExists

    try:
        db.collection(store.JOBS).document(job_id).create(
            JobDoc.fields(
                id=job_id,
                state=JobState.rejected,
                reason=f"{field_name}: {reason}" if field_name and not reason.startswith(field_name) else reason,
                source=msg.attributes.get("source", "pubsub"),
                owner=_owner_or_none(msg.attributes),
                message_id=msg.message_id,
                submit_time=now,
                updated_at=now,
            )
        )
    except AlreadyExists:
        pass
