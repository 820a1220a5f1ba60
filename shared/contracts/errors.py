"""One error taxonomy that says what to do.

Each class is raised somewhere and acted on somewhere:
- `Retryable`: try again later (`call_api`'s retry loop, then Pub/Sub redelivery). May carry a delay.
- `Permanent`: will never succeed; record it and stop (the handler adapter dead-letters the message). Carries
  the field when input was bad.
- `NotFound`: the resource is gone (a delete is done; a watched queued resource is GONE).
- `AlreadyExists`: a create found its resource (a redelivered create of the same deterministic name).

What a cloud refusal means for capacity (stockout, zone quota, a blocked project) is not a class here: only
`tpuq.claimer.classify` reads error texts, and it decides from the structured details (`ErrorInfo`), the message
and the code `call_api` keeps. `from_api_error` maps google.api_core exceptions into the taxonomy once;
`error_info_of` and `status_error_info` read the structured details of an API error and of a google.rpc.Status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from tpuq.contracts.fieldnames import did_you_mean, known_fields

# "field: reason", "field[1]: ...", "jobs[2].depends_on[0]: ...": a validator's message naming where it applies.
_FIELD_PREFIX = re.compile(r"^([a-z_][a-z0-9_]*(?:\[\d+\])?(?:\.[a-z_][a-z0-9_]*(?:\[\d+\])?)*): ")


class TpuqError(Exception):
    """Base of the taxonomy."""


class Retryable(TpuqError):
    def __init__(self, message: str, delay_seconds: float | None = None):
        super().__init__(message)
        self.delay_seconds = delay_seconds


class Permanent(TpuqError):
    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class NotFound(TpuqError):
    pass


ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE_TYPE = "type.googleapis.com/google.rpc.QuotaFailure"
# Service Infrastructure's quota reasons (google.api.ErrorReason, domain googleapis.com).
REASON_RATE_LIMIT_EXCEEDED = "RATE_LIMIT_EXCEEDED"
REASON_RESOURCE_QUOTA_EXCEEDED = "RESOURCE_QUOTA_EXCEEDED"


@dataclass(frozen=True)
class ErrorInfo:
    """The structured part of a google.rpc.Status: its `google.rpc.ErrorInfo` (reason, domain, metadata) and the
    subjects and descriptions of a `google.rpc.QuotaFailure`. Either may be missing: many errors carry neither."""

    reason: str | None = None
    domain: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    quota_violations: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.reason or self.quota_violations)

    def meta(self, key: str) -> str | None:
        return dict(self.metadata).get(key)


def _field(detail: Any, name: str, json_name: str | None = None) -> Any:
    if isinstance(detail, Mapping):
        return detail.get(json_name or name)
    return getattr(detail, name, None)


def _type_of(detail: Any) -> str:
    if isinstance(detail, Mapping):
        return str(detail.get("@type") or "")
    type_url = getattr(detail, "type_url", None)  # a google.protobuf.Any
    if type_url:
        return type_url
    descriptor = getattr(detail, "DESCRIPTOR", None)  # an unpacked message (gRPC's exception details)
    return f"type.googleapis.com/{descriptor.full_name}" if descriptor is not None else ""


def _unpacked(detail: Any) -> Any:
    """A google.protobuf.Any holding an ErrorInfo or QuotaFailure, unpacked; anything else as it is."""
    if isinstance(detail, Mapping) or not hasattr(detail, "type_url"):
        return detail
    from google.rpc import error_details_pb2

    for cls in (error_details_pb2.ErrorInfo, error_details_pb2.QuotaFailure):
        if detail.Is(cls.DESCRIPTOR):
            message = cls()
            detail.Unpack(message)
            return message
    return detail


def error_info_from_details(details: Iterable[Any] | None) -> ErrorInfo | None:
    """Read a status's `details` (REST: dicts with "@type"; gRPC or a parsed Status: messages or Anys)."""
    reason = domain = None
    metadata: tuple[tuple[str, str], ...] = ()
    violations: list[str] = []
    for raw in details or ():
        kind = _type_of(raw)
        detail = _unpacked(raw)
        if kind == ERROR_INFO_TYPE and reason is None:
            reason = _field(detail, "reason") or None
            domain = _field(detail, "domain") or None
            metadata = tuple(sorted((str(k), str(v)) for k, v in dict(_field(detail, "metadata") or {}).items()))
        elif kind == QUOTA_FAILURE_TYPE:
            for violation in _field(detail, "violations") or ():
                violations += [str(v) for v in (_field(violation, "subject"), _field(violation, "description")) if v]
    info = ErrorInfo(reason, domain, metadata, tuple(violations))
    return None if info.empty else info


def error_info_of(exc: BaseException) -> ErrorInfo | None:
    """The structured details of a google.api_core exception (`.details`, `.reason`, `.domain`, `.metadata`)."""
    info = error_info_from_details(getattr(exc, "details", None) or ())
    reason = getattr(exc, "reason", None)
    if reason and (info is None or info.reason is None):
        metadata = tuple(sorted((str(k), str(v)) for k, v in (getattr(exc, "metadata", None) or {}).items()))
        info = ErrorInfo(reason, getattr(exc, "domain", None), metadata, info.quota_violations if info else ())
    return info


def status_error_info(status: Any) -> ErrorInfo | None:
    """The structured details of a google.rpc.Status (a failed queued resource's `state.failedData.error`)."""
    return error_info_from_details(getattr(status, "details", None) or ())


class AlreadyExists(TpuqError):
    pass


def _loc_to_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:  # a key with a newline or another control character is quoted: the field stays on one line
            out += ("." if out else "") + (str(part) if str(part).isprintable() else repr(str(part)))
    return out


_EXPECTED = {  # pydantic's type errors, as a person writing YAML reads them
    "string_type": "text", "int_type": "a whole number", "int_parsing": "a whole number",
    "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
    "dict_type": "a mapping (key: value lines)",
}


def shown_value(value: Any) -> str:
    """A value as a person writing YAML recognizes it: "nothing", "true", "a list (['a', 'b'])", "a date
    (2026-12-05)", 'three'."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"a list ({_short_repr(list(value))})"
    if isinstance(value, dict):
        return f"a mapping ({_short_repr(value)})"
    if isinstance(value, (date, datetime)):
        return f"a date ({value.isoformat()})"
    return _short_repr(value)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# What YAML made of an unquoted value where text was wanted, and so why it is not text.
_READ_AS = ((bool, "true or false: yes, no, on and off are too"), ((int, float), "a number"),
            ((date, datetime), "a date"))


def _type_message(e: dict) -> str | None:
    """"text expected, got 5 (YAML read a number): quote it as you wrote it" for pydantic's "Input should be a valid
    string"; None: not a type error of a kind people make. The value is shown as read, not as typed (`010` reads as
    8, `1.10` as 1.1), so the fix says to quote what was written."""
    if e.get("type") in ("enum", "literal_error") and "input" in e and (e.get("ctx") or {}).get("expected"):
        return f"{e['ctx']['expected']} expected, got {shown_value(e['input'])}"  # `priority: urgent`
    expected = _EXPECTED.get(e.get("type", ""))
    if expected is None or "input" not in e:
        return None
    given = e["input"]
    msg = f"{expected} expected, got {shown_value(given)}"
    if e["type"] == "string_type":
        read_as = next((what for kinds, what in _READ_AS if isinstance(given, kinds)), None)
        if read_as:
            msg += f" (YAML read {read_as}): quote it as you wrote it"
    return msg


def describe_validation_error(err: ValidationError, prefix: str = "",
                              model: type[BaseModel] | None = None) -> tuple[str, str]:
    """(field, one-line reason) for the first problem; the full text lists all of them. With the `model` that was
    validated, an unknown field says which known one it most likely misspells (first, and a required field it
    stands for is not said to be missing as well)."""
    found: list[tuple[str, str, tuple, str | None]] = []  # (field, message, location, the field meant)
    for e in err.errors(include_url=False):
        loc = tuple(p for p in e.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-")))
        # pydantic puts the model-level validator name or the union tag in loc; drop noise.
        field = _loc_to_path(loc)
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        msg = e.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # Model-level validators have no location; their messages start with "field: ".
        named = _FIELD_PREFIX.match(msg)
        if named:
            field = ".".join(p for p in (field, named.group(1)) if p)
            msg = msg[named.end():]
        meant = None
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
            meant = model is not None and loc and isinstance(loc[-1], str) and \
                did_you_mean(loc[-1], known_fields(model, loc[:-1])) or None
            if meant:
                msg += f"; did you mean `{meant}`?"
        elif e.get("type") == "missing":
            msg = "is required"
        else:
            msg = _type_message(e) or msg
        found.append((field or "(message)", msg, loc, meant))
    meant_at = {(*loc[:-1], meant) for _, _, loc, meant in found if meant}
    kept = [f for f in found if not (f[1] == "is required" and f[2] in meant_at)]
    kept.sort(key=lambda f: f[3] is None)  # a misspelling first: it often explains the rest
    return kept[0][0] if kept else "(message)", "; ".join(f"{field}: {msg}" for field, msg, _, _ in kept)


def from_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> Permanent:
    field, reason = describe_validation_error(err, prefix, model)
    return Permanent(reason, field=field)


_RATE_LIMIT = re.compile(r"per (second|minute|100 seconds|day)|rate limit|rateLimitExceeded|RATE_LIMIT", re.I)
_QUOTA_OR_CAPACITY = re.compile(r"Limit:? \d+ in zone|no more capacity|STOCKOUT|RESOURCE_POOL_EXHAUSTED|"
                                r"Quota limit '|Quota '[^']+' exhausted|PerProjectPerZone|PerProjectPerRegion", re.I)


def _is_rate_limit(exc: BaseException) -> bool:
    """A 429 is a rate limit unless it names a zone's quota or capacity. Structure first: Service
    Infrastructure's RATE_LIMIT_EXCEEDED is one; a QuotaFailure (what the TPU API sends with a zone's quota) or
    RESOURCE_QUOTA_EXCEEDED is not, unless it counts requests per unit of time. Then the text."""
    info = error_info_of(exc)
    if info is not None:
        if info.reason == REASON_RATE_LIMIT_EXCEEDED:
            return True
        if info.reason == REASON_RESOURCE_QUOTA_EXCEEDED or info.quota_violations:
            return bool(_RATE_LIMIT.search(" ".join(info.quota_violations)))
    message = str(exc)
    return bool(_RATE_LIMIT.search(message)) or not _QUOTA_OR_CAPACITY.search(message)


def from_api_error(exc: BaseException) -> TpuqError:
    """Map a google.api_core / requests / transport exception into the taxonomy."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, TpuqError):
        return exc
    if isinstance(exc, gexc.NotFound):
        return NotFound(str(exc))
    if isinstance(exc, (gexc.AlreadyExists, gexc.Conflict)):
        return AlreadyExists(str(exc))
    if isinstance(exc, (gexc.TooManyRequests, gexc.ResourceExhausted)) and not _is_rate_limit(exc):
        # Over REST a synchronous RESOURCE_EXHAUSTED arrives as HTTP 429. When it names a zone's quota or
        # capacity it is not a rate limit: retrying cannot help; the claimer's classifier decides from the text.
        return Permanent(str(exc))
    if isinstance(
        exc,
        (
            gexc.TooManyRequests,
            gexc.ServiceUnavailable,
            gexc.DeadlineExceeded,
            gexc.InternalServerError,
            gexc.BadGateway,
            gexc.GatewayTimeout,
            gexc.Aborted,
            gexc.RetryError,
        ),
    ):
        return Retryable(str(exc))
    if isinstance(exc, (gexc.PermissionDenied, gexc.Forbidden)):  # REST renders 403 as Forbidden
        # Billing or permission: never fixed by retrying; the claimer's classifier tells which from the text.
        return Permanent(str(exc))
    if isinstance(exc, gexc.ResourceExhausted):
        # 429-shaped rate limits come as TooManyRequests; ResourceExhausted here is quota or capacity,
        # which only the claimer's classifier can tell apart by message.
        return Permanent(str(exc))
    if isinstance(exc, (gexc.InvalidArgument, gexc.BadRequest, gexc.FailedPrecondition, gexc.Unauthenticated)):
        return Permanent(str(exc))
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return Retryable(str(exc))
    try:
        import requests

        if isinstance(exc, requests.RequestException):
            return Retryable(str(exc))
    except ImportError:  # pragma: no cover
        pass
    return Retryable(f"{type(exc).__name__}: {exc}")


def call_api(fn, *, attempts: int, initial_wait: float, max_wait: float, annotate=None, **kwargs):
    """Call a Google API method: map any failure into the taxonomy once, and retry only `Retryable` ones
    (429 rate limits, 5xx, deadlines) with exponential back-off and jitter. The original exception is the
    `__cause__`; `annotate(mapped, original)` may copy details (an RPC code, the ErrorInfo) onto the mapped error."""
    # The first try goes without tenacity (building its Retrying costs more than a local call: the janitor and
    # the claimer's watch make one call per resource per pass); only a Retryable failure enters the loop, as
    # its first attempt, so the waits and the number of tries are tenacity's.
    try:
        return _mapped_call(fn, kwargs, annotate)
    except Retryable as e:
        if attempts <= 1:
            raise
        first_failure: Retryable | None = e
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

    retrying = Retrying(
        retry=retry_if_exception_type(Retryable),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=initial_wait, max=max_wait, jitter=initial_wait),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            if first_failure is not None:
                failure, first_failure = first_failure, None
                raise failure
            return _mapped_call(fn, kwargs, annotate)


def _mapped_call(fn, kwargs, annotate):
    try:
        return fn(**kwargs)
    except TpuqError:
        raise
    except Exception as e:  # noqa: BLE001 - mapped into the taxonomy just below
        mapped = from_api_error(e)
        if annotate is not None:
            annotate(mapped, e)
        raise mapped from e


def missing_bucket_line(name: str, region: str | None) -> str:
    """One missing bucket, and what to run."""
    location = f" --location={region}" if region else " --location=REGION"
    return (f"bucket gs://{name} does not exist: create it (gcloud storage buckets create gs://{name}{location}) "
            "or name an existing bucket in the job's `buckets`")
