"""Hypothesis strategies for malformed input: hostile strings, wrong-typed JSON, and a valid message of each topic
broken by a few mutations (a field of the wrong type, a required one dropped, an unknown one added, a hostile
string where an id, a path, an env name or a cache goes).

A payload is known to be refused by its topic's model before it is sent (`refused`): a mutation that happened to
leave the message valid gets one more, an unknown field (or, for the GCS notification, which ignores unknown
fields, its object name dropped).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from tpuq.contracts import topology
from tpuq.contracts.jobspec import PublishedJob

TRAVERSAL = ["../", "../../etc/passwd", "..", ".", "a/b", "seed-running/attempts/1", "/", "", "__x__", "__name__",
             "jobs/../tpus", "..\\..\\windows", "%2e%2e%2f", "submit/../../x", "/etc/shadow", "~/.ssh/id_rsa",
             "projects/p/locations/z/nodes/", "projects/p/locations/z/nodes/..", "seed-tpu", "seed-running"]
SHELL = ["$(rm -rf /)", "`id`", "; rm -rf ~", "a|b", "a && b", "x\ny", "'\"", "${IFS}", "$HOME", "*", "~root",
         "a\x00b", "-rf", "--help", "\\", "!!", "a;b", ">/dev/null", "<(cat)", "$((1/0))", "\r\n"]
UNICODE = ["é", "日本語", "\u202e", "\ufeff", "\ud800", "\udfff", "😀", "\u0000", "Ⅸ", "²", "١٢", "ﬀ", "İ", "\u200b",
           "Ａ", "\x7f", "\u2028"]
SEEDED = ["seed-running", "seed-pending", "seed-tpu", "test"]


def _huge() -> st.SearchStrategy[str]:
    return st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "😀", "/", "../", "$("]),
                     st.integers(1_000, 120_000))


def _hostile_strings(huge: bool) -> st.SearchStrategy[str]:
    pool = TRAVERSAL + SHELL + UNICODE + SEEDED
    return st.one_of(
        st.sampled_from(pool),
        st.builds(lambda a, b: a + b, st.sampled_from(pool), st.sampled_from(pool)),
        st.text(max_size=30),
        st.text(st.characters(codec="utf-8"), max_size=8).map(lambda s: "seed-" + s),
        *([_huge()] if huge else []),
    )


def _json_values(strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(), strings)
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(strings, inner, max_size=4)), max_leaves=8)


# Built once: a strategy made anew for every draw is validated anew, which costs more than the push. The SMALL
# ones leave out the huge strings, for job files: PyYAML is pure Python, and 100 kB of YAML takes it a second.
HOSTILE_STRINGS = _hostile_strings(huge=True)
JSON_VALUES = _json_values(HOSTILE_STRINGS)
SMALL_HOSTILE_STRINGS = _hostile_strings(huge=False)
SMALL_JSON_VALUES = _json_values(SMALL_HOSTILE_STRINGS)


def hostile_strings() -> st.SearchStrategy[str]:
    return HOSTILE_STRINGS


def json_values() -> st.SearchStrategy[Any]:
    return JSON_VALUES


AT = "2026-01-01T00:00:00Z"
NODE = "projects/tpuq-local/locations/us-central2-b/nodes/fz-node"
QR = "projects/tpuq-local/locations/us-central2-b/queuedResources/fz-node"


def _job() -> dict:
    return {"id": "fz-job", "tpu": "v4-8", "command": "python train.py", "env": {"A": "1"},
            "caches": [{"key": "pip", "path": ".cache/pip"}], "buckets": ["gs://fz-bucket-us-central2"],
            "bundle": "gs://fz-bucket-us-central2/b.tar.gz", "priority": "high"}


# A valid message of each topic, to be broken.
BASES: dict[str, list[dict]] = {
    "jobs": [_job(), {"tpu": ["v4-8", "v5litepod-8"], "command": "x"}, {"jobs": [_job(), {"tpu": "v4-8", "command": "y"}]}],
    "capacity": [{"request_id": "r-1", "fleet": "test", "types": ["v4-8"], "zones": ["us-central2-b"], "count": 1},
                 {"request_id": "r-2", "action": "withdraw", "fleet": "test"}],
    "fleet-events": [{"kind": "ACTIVE", "fleet": "test", "queued_resource": QR, "zone": "us-central2-b",
                      "type": "v4-8", "node": NODE, "chips": 4, "hosts": 1, "at": AT,
                      "endpoints": [{"worker_id": 0, "ip": "10.0.0.2", "port": 22}]},
                     {"kind": "FAILED", "fleet": "test", "queued_resource": QR, "zone": "us-central2-b",
                      "type": "v4-8", "failure_class": "capacity", "failure_message": "stockout", "at": AT}],
    "assignments": [{"job_id": "fz-job", "attempt": 1, "attempt_id": "fz-job-1", "node": NODE, "zone": "us-central2-b",
                     "endpoints": [{"worker_id": 0, "ip": "10.0.0.2", "port": 22}], "job": _job(), "at": AT},
                    {"action": "cancel", "job_id": "fz-job", "attempt": 1, "attempt_id": "fz-job-1", "node": NODE,
                     "zone": "us-central2-b", "at": AT}],
    "attempt-events": [{"kind": "started", "job_id": "fz-job", "attempt": 1, "attempt_id": "fz-job-1", "node": NODE,
                        "at": AT},
                       {"kind": "ended", "job_id": "fz-job", "attempt": 2, "attempt_id": "fz-job-2", "node": NODE,
                        "outcome": "failed", "detail": "exit 1", "exit_codes": {"0": 1}, "at": AT}],
    "ticks": [{"seq": 1, "at": AT, "source": "tick"}],
    "cancels": [{"job_id": "fz-job", "reason": "no", "if_pending": True, "expected_attempt": 0}],
    "notifications": [{"event_id": "failed:fz-job", "event": "failed", "subject": "fz-job", "title": "fz-job failed",
                       "text": "exit 1", "lines": ["boom"], "fields": {"state": "failed"},
                       "destinations": [{"secret": "fz-hook", "format": "json"}], "at": AT}],
    "gcs-events": [{"bucket": "tpuq-runner", "name": "tpuq/attempts/fz-job/1/status-0.json", "generation": "1"},
                   {"bucket": "tpuq-runner", "name": "submit/x.yaml", "size": 10}],
}
# The ticks the janitor routes to the other services (`tpuq.runtime.tickdue`) are the clock's own `Tick`.
BASES.update({topic: BASES["ticks"] for topic in topology.tick_topics()})

# Where strings a model may not check go: ids, names, paths, env and caches.
NESTED_STRING_PLACES = {
    "jobs": [("env", None), ("caches", "key"), ("caches", "path"), ("buckets", None)],
    "fleet-events": [("endpoints", "ip")],
    "assignments": [("endpoints", "ip"), ("job", "command"), ("job", "id")],
    "notifications": [("destinations", "secret"), ("fields", None)],
}


def model_fields(topic: str) -> list[str]:
    model = topology.topic(topic).model
    fields = getattr(model, "model_fields", None) or PublishedJob.model_fields
    return list(fields)


def refused(topic: str, payload: Any) -> bool:
    """Whether the topic's model refuses `payload` (any exception counts: the push shows whether it is handled)."""
    try:
        topology.topic(topic).model.model_validate(payload)
    except Exception:  # noqa: BLE001
        return True
    return False


def _break(topic: str, payload: dict) -> dict:
    """One more mutation that no model accepts."""
    if topic == "gcs-events":
        payload.pop("name", None)
    else:
        payload["zz_unknown_field"] = True
    return payload


@st.composite
def _nested(draw, topic: str, payload: dict, strings, values) -> None:
    places = NESTED_STRING_PLACES.get(topic)
    if not places:
        return
    where, key = draw(st.sampled_from(places))
    value = draw(strings)
    target = payload
    if topic == "jobs" and "jobs" in payload and isinstance(payload["jobs"], list) and payload["jobs"]:
        target = payload["jobs"][0] if isinstance(payload["jobs"][0], dict) else payload
    if not isinstance(target, dict):
        return
    if where == "env":
        env = target.get("env") if isinstance(target.get("env"), dict) else {}
        env[draw(strings)] = draw(values)
        target["env"] = env
    elif key is None:
        target[where] = [value]
    elif where == "job":
        job = target.get("job") if isinstance(target.get("job"), dict) else {}
        job[key] = value
        target["job"] = job
    else:
        items = target.get(where) if isinstance(target.get(where), list) and target.get(where) else [{}]
        if isinstance(items[0], dict):
            items[0] = {**items[0], key: value}
        target[where] = items


@st.composite
def broken_message(draw, topic: str, small: bool = False) -> dict:
    """A valid message of `topic` with 1-3 mutations; always refused by the topic's model. `small`: no huge
    strings."""
    strings, values = (SMALL_HOSTILE_STRINGS, SMALL_JSON_VALUES) if small else (HOSTILE_STRINGS, JSON_VALUES)
    payload = copy.deepcopy(draw(st.sampled_from(BASES[topic])))
    fields = model_fields(topic)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["retype", "retype", "drop", "extra", "hostile", "hostile", "nested"]))
        if op == "retype":
            payload[draw(st.sampled_from(fields))] = draw(values)
        elif op == "drop" and payload:
            payload.pop(draw(st.sampled_from(sorted(payload))))
        elif op == "extra":
            payload[draw(strings)] = draw(values)
        elif op == "hostile":
            payload[draw(st.sampled_from(fields))] = draw(strings)
        else:
            draw(_nested(topic, payload, strings, values))
    if not refused(topic, payload):
        payload = _break(topic, payload)
    assert refused(topic, payload), payload
    return payload


def _not_an_object() -> st.SearchStrategy[bytes]:
    """Message data that is no JSON object: not UTF-8, not JSON, or JSON of another type."""
    return st.one_of(
        st.binary(max_size=64).filter(lambda b: not b.strip().startswith(b"{")),
        st.sampled_from([b"\xff\xfe{", b"{", b"{\"a\":", b"null", b"[]", b"\"{}\"", b"1e999", b"NaN", b"{}}",
                         b"\xed\xa0\x80", b"{\"a\": \"\\ud800\"", b"[{}]"]),
        json_values().filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    )


NOT_AN_OBJECT = _not_an_object()


def not_an_object() -> st.SearchStrategy[bytes]:
    return NOT_AN_OBJECT


@st.composite
def malformed_data(draw, topic: str) -> bytes:
    """The `data` of a push: a broken message of `topic` as JSON, or something that is not a JSON object."""
    if draw(st.integers(0, 4)) == 0:
        return draw(NOT_AN_OBJECT)
    return json.dumps(draw(broken_message(topic))).encode()


def _utf8_within(limit: int):
    def ok(s: str) -> bool:
        try:
            return len(s.encode("utf-8")) <= limit
        except UnicodeEncodeError:
            return False
    return ok


# Pub/Sub attributes as Pub/Sub delivers them: UTF-8 text, keys of at most 256 bytes, values of at most 1024;
# `owner` and `source` are read by the scheduler.
ATTRIBUTES = st.dictionaries(
    st.one_of(st.sampled_from(["owner", "source", "fleet", "kind"]), HOSTILE_STRINGS).filter(
        lambda k: k != "" and _utf8_within(256)(k)),
    HOSTILE_STRINGS.filter(_utf8_within(1024)), max_size=3)


def attributes() -> st.SearchStrategy[dict[str, str]]:
    return ATTRIBUTES
