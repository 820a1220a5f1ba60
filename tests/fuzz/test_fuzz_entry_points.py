"""Fuzz every entry point: malformed payloads on every push path of every service, malformed envelopes, job files
to `tpuq validate` and to the bucket's `submit/` path (tests/fuzz/payloads.py makes them).

For every payload: no crash (a 5xx only from a deliberate retry, a typed `Retryable`); a refused message is
acknowledged and recorded with a field and a reason (a dead letter; a rejected job for a `jobs` message naming a
free id; a result file beside an upload); a request that is no Pub/Sub push gets a 400; and nothing already stored
changes (tests/fuzz/bed.py seeds the store through the scheduler and judges every answer).

Reproducible: the `fuzz` settings profile is derandomized, with no deadline and no example database. The
budgets below send FUZZ_TOTAL payloads in all; `test_every_entry_point_was_fuzzed` asserts the tally.
"""

from __future__ import annotations

import io
import json
import os
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tpuq.contracts import topology
from tpuq.cli.app import main as tpuq_main
from tpuq.contracts.errors import Permanent, describe_validation_error
from tpuq.contracts.jobspec import JOB_ID_RE, JobFile
from tpuq.scheduler.gcs_submit import RESULT_SUFFIX, parse_job_file
from tests.fuzz import payloads as p
from tests.fuzz.bed import RUNNER_BUCKET, envelope, make_bed, quiet

settings.register_profile("fuzz", deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=list(HealthCheck))
FUZZ = settings.get_profile("fuzz")

# Payloads per test; FUZZ_TOTAL in all (the suite's figure, docs/DEVELOPING.md "Fuzzing"). TPUQ_FUZZ_SCALE multiplies
# them (benchmarks/fuzz.py runs this file with a larger one).
SCALE = float(os.environ.get("TPUQ_FUZZ_SCALE", "1"))
MESSAGES_PER_PATH = int(30 * SCALE)  # x 14 push paths
HOSTILE_PER_ENTRY = int(15 * SCALE)  # x len(HOSTILE)
ENVELOPES_PER_SERVICE = int(25 * SCALE)  # x 4 services
JOB_FILES = int(40 * SCALE)  # to `tpuq validate`
UPLOADS = int(40 * SCALE)  # to submit/ in the bucket
REFUSED = frozenset({"dead_letter", "rejected_job"})

SUBS = list(topology.SUBSCRIPTIONS)


def budget(n: int) -> settings:
    return settings(FUZZ, max_examples=n)


@pytest.fixture(scope="module")
def bed():
    with quiet():
        b = make_bed()
        yield b
    print(f"\nfuzz: {sum(b.sent.values())} payloads, {dict(b.outcomes)}, per entry point {dict(b.sent)}")
    if os.environ.get("TPUQ_FUZZ_REPORT"):  # benchmarks/fuzz.py reads the tally here
        Path(os.environ["TPUQ_FUZZ_REPORT"]).write_text(json.dumps({
            "payloads": sum(b.sent.values()), "crashes": b.outcomes["crash"], "outcomes": dict(b.outcomes),
            "per_entry_point": dict(b.sent)}))


@pytest.fixture(autouse=True)
def _own_crashes(bed):
    bed.crashes.clear()  # a test reports the crashes of its own payloads


def settled(bed) -> None:
    """No crash in this test, and the store holds only what a refusal may write."""
    crashes, bed.crashes = bed.crashes, []
    assert not crashes, "\n".join(str(c) for c in crashes[:10])
    problems = bed.check_store()
    assert not problems, "\n".join(problems[:10])


def _named_job(sub: topology.Subscription, data: bytes) -> str | None:
    """The job id a `jobs` message names, when it is one a rejected job can be stored under."""
    if sub.topic != "jobs":
        return None
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    candidate = payload.get("job_id") or payload.get("id") if isinstance(payload, dict) else None
    return candidate if isinstance(candidate, str) and JOB_ID_RE.match(candidate) else None


def _push_message(bed, entry: str, sub: topology.Subscription, data: bytes, attributes: dict[str, str],
                  allowed: frozenset[str]) -> str:
    message_id = bed.message_id()
    job_id = _named_job(sub, data)
    free = job_id is not None and not bed.db.collection("jobs").document(job_id).get().exists
    kind = bed.push(entry, sub, envelope(data, message_id, sub, attributes), message_id, allowed,
                    job_id if free else None)
    if free and kind != "crash":
        assert kind == "rejected_job", (kind, job_id, data[:300])
    return kind


# ------------------------------------------------------------------ every topic model, on every push path


@pytest.mark.parametrize("sub", SUBS, ids=[f"{s.service}{s.path}" for s in SUBS])
def test_malformed_messages_are_dead_lettered(bed, sub):
    @budget(MESSAGES_PER_PATH)
    @given(data=p.malformed_data(sub.topic), attributes=p.attributes())
    # Found by this fuzzer, fixed: a refused job's id that is a path (the rejected job was written to
    # jobs/a/b..., or the write failed and the refusal was retried for ever); a field naming a key that is a lone
    # surrogate (a dead letter Firestore cannot store).
    @example(data=b'{"id": "a/b", "tpu": "v4-8", "command": 1}', attributes={})
    @example(data=b'{"id": "seed-running/attempts/2", "command": 1}', attributes={})
    @example(data=b'{"id": "..", "command": 1}', attributes={})
    @example(data=b'{"\\ud800": 1, "job_id": "x"}', attributes={})
    def fuzz(data, attributes):
        _push_message(bed, f"{sub.service}{sub.path}", sub, data, attributes, REFUSED)

    fuzz()
    settled(bed)


# ------------------------------------------------------------------ valid by the model, hostile in content
# Messages a topic model accepts whose ids and names are traversal, shell or unicode strings: the handler must
# refuse them (a dead letter), find nothing to do (204), or retry deliberately (a fleet not stored yet), and never
# touch the seeded jobs and TPUs. Only where a handler needs nothing but Firestore and GCS to decide.

def _not_seeded(s: str) -> bool:
    return s not in p.SEEDED


ids = p.hostile_strings().filter(_not_seeded)
HOSTILE = {
    "scheduler/push/cancels": st.fixed_dictionaries({"job_id": ids}, optional={"reason": p.hostile_strings()}),
    "scheduler/push/attempt-events": st.fixed_dictionaries({
        "kind": st.sampled_from(["started", "ended"]), "job_id": ids, "attempt": st.integers(1, 2 ** 31),
        "attempt_id": p.hostile_strings(), "node": p.hostile_strings(), "at": st.just(p.AT),
        "outcome": st.sampled_from(["succeeded", "failed", "preempted", "infra_failed", "cancelled"])}),
    "janitor/push/attempt-events": st.fixed_dictionaries({
        "kind": st.just("ended"), "job_id": ids, "attempt": st.integers(1, 9), "attempt_id": p.hostile_strings(),
        "node": ids, "at": st.just(p.AT), "outcome": st.sampled_from(["preempted", "infra_failed"])}),
    "scheduler/push/fleet-events": st.fixed_dictionaries({
        "kind": st.just("ACTIVE"), "fleet": p.hostile_strings(), "queued_resource": p.hostile_strings(),
        "zone": p.hostile_strings(), "type": p.hostile_strings(), "at": st.just(p.AT)}),  # no node: refused
    "janitor/push/fleet-events": st.fixed_dictionaries({
        "kind": st.sampled_from(["ACTIVE", "FAILED", "SUSPENDED"]), "fleet": ids,
        "queued_resource": p.hostile_strings(), "zone": p.hostile_strings(), "type": p.hostile_strings(),
        "at": st.just(p.AT)}),
    "claimer/push/capacity": st.fixed_dictionaries({
        "request_id": st.from_regex(r"^[a-z0-9][a-z0-9-]{0,40}$", fullmatch=True), "fleet": ids,
        "types": st.lists(p.hostile_strings(), max_size=2)}),
    "executor/push/gcs-status": st.fixed_dictionaries({
        "bucket": p.hostile_strings(),
        "name": st.one_of(p.hostile_strings(), st.builds("tpuq/attempts/{}/{}/status-{}.json".format,
                                                         p.hostile_strings(), st.integers(), st.integers()))}),
    "scheduler/push/gcs-submit": st.fixed_dictionaries({
        "bucket": st.one_of(st.just(RUNNER_BUCKET), p.hostile_strings()),
        "name": st.one_of(p.hostile_strings(), st.builds("submit/{}.yaml".format, p.hostile_strings()))}),
}


# Found by this fuzzer, fixed: ids and names that are Firestore paths or ids it refuses (a 500, or a read of
# another document: jobs/seed-running/attempts/1 as a job); a notification for a job file already gone (a 500).
HOSTILE_FOUND = {
    "claimer/push/capacity": [{"request_id": "r", "fleet": "../", "types": []}],
    "janitor/push/fleet-events": [{"kind": "FAILED", "fleet": "a/b", "queued_resource": "q", "zone": "z",
                                   "type": "t", "at": p.AT}],
    "scheduler/push/cancels": [{"job_id": "seed-running/attempts/1"}, {"job_id": ".."}],
    "scheduler/push/attempt-events": [{"kind": "ended", "job_id": "seed-running/attempts/1", "attempt": 1,
                                       "attempt_id": "x", "node": "seed-tpu", "outcome": "failed", "at": p.AT}],
    "janitor/push/attempt-events": [{"kind": "ended", "job_id": "j", "attempt": 1, "attempt_id": "x",
                                     "node": "projects/p/locations/z/nodes/", "outcome": "preempted", "at": p.AT}],
    "scheduler/push/gcs-submit": [{"bucket": RUNNER_BUCKET, "name": "submit/../.yaml"}],
}


def _sub(entry: str) -> topology.Subscription:
    service, _, path = entry.partition("/")
    sub = topology.subscription_by_path(service, "/" + path)
    assert sub is not None, entry
    return sub


@pytest.mark.parametrize("entry", sorted(HOSTILE))
def test_hostile_but_valid_messages_touch_nothing_stored(bed, entry):
    sub = _sub(entry)

    @budget(HOSTILE_PER_ENTRY)
    @given(message=HOSTILE[entry], attributes=p.attributes())
    def fuzz(message, attributes):
        data = json.dumps(message).encode()
        allowed = REFUSED if p.refused(sub.topic, message) else REFUSED | {"accepted", "retry"}
        _push_message(bed, f"{entry} hostile", sub, data, attributes, allowed)

    for found in HOSTILE_FOUND.get(entry, []):
        fuzz = example(message=found, attributes={})(fuzz)

    fuzz()
    settled(bed)


# ------------------------------------------------------------------ requests that are no Pub/Sub push


def _not_an_envelope() -> st.SearchStrategy[bytes]:
    message = st.fixed_dictionaries({}, optional={
        "data": st.one_of(p.json_values(), st.just("!!not base64!!")), "messageId": p.json_values(),
        "attributes": p.json_values(), "publishTime": p.json_values()})
    return st.one_of(
        st.binary(max_size=80),
        p.json_values().map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"message": p.json_values()}, optional={"subscription": p.json_values()})
        .map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"message": message}, optional={"deliveryAttempt": p.json_values()})
        .map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"specversion": st.just("1.0"), "data": p.json_values()}, optional={"id": p.json_values()})
        .map(lambda v: json.dumps(v).encode()),
    )


@pytest.mark.parametrize("service", topology.SERVICES)
def test_requests_that_are_no_push_get_400(bed, service):
    subs = topology.subscriptions_for(service)

    @budget(ENVELOPES_PER_SERVICE)
    @given(sub=st.sampled_from(subs), body=_not_an_envelope())
    # Found by this fuzzer, fixed: attributes that are no object, data that is no string, a delivery attempt in
    # digits int() does not read, and a message id that is no UTF-8 were 500s.
    @example(sub=subs[0], body=b'{"message": {"data": "e30=", "messageId": "1", "attributes": ["a"]}}')
    @example(sub=subs[0], body=b'{"message": {"data": 5, "messageId": "1"}}')
    @example(sub=subs[0], body='{"message": {"data": "", "messageId": "1"}, "deliveryAttempt": "²"}'.encode())
    @example(sub=subs[0], body=b'{"message": {"data": "", "messageId": "\\ud800"}}')
    def fuzz(sub, body):
        # Whatever part of it is a push, its data is never a valid message: refused, or a 400.
        bed.push(f"{service} envelope", sub, body, _message_id_in(body), REFUSED | {"bad_envelope"})

    fuzz()
    settled(bed)


def _message_id_in(body: bytes) -> str | None:
    try:
        envelope_ = json.loads(body)
        message = envelope_.get("message") if isinstance(envelope_, dict) else None
        if isinstance(envelope_, dict) and "specversion" in envelope_:
            message = (envelope_.get("data") or {}).get("message") if isinstance(envelope_.get("data"), dict) else None
            mid = (message or {}).get("messageId") if isinstance(message, dict) else None
            return str(mid or envelope_.get("id") or "") or None
        mid = message.get("messageId") or message.get("message_id") if isinstance(message, dict) else None
        return str(mid) if mid else None
    except ValueError:
        return None


# ------------------------------------------------------------------ job files: `tpuq validate` and submit/

YAML_TRAPS = ["!!python/object/apply:os.system ['id']", "jobs: &a [*a]", "- - -", "jobs:\n\t- x", "key: [",
              "jobs: *undefined", "%YAML 9.9\n---\n", "jobs: !!binary AAAA", "jobs:\n  - tpu: v4-8\n    command: x\n    "
              "env: {A: !!python/name:os.system}", "? [a]\n: b", "jobs: [{tpu: v4-8, command: x, id: ../../x}]",
              "---\n---\n", "\ufeffjobs: []", "jobs: [{tpu: v4-8, command: '$(rm -rf /)', env: {'A;B': x}}]"]


@st.composite
def broken_job_file(draw) -> dict:
    """A job.yaml as a mapping, refused by JobFile: a job broken as a topic message is, or the file itself."""
    job = draw(p.broken_message("jobs", small=True))
    job.pop("jobs", None)
    job.setdefault("bundle", draw(st.sampled_from([".", "../..", "src", "/etc", "a/../../b"])))
    data = draw(st.sampled_from([{"jobs": [job]}, job, {"jobs": [job, job]}, {"jobs": job}]))
    try:
        JobFile.model_validate(data)
    except Exception:  # noqa: BLE001
        return data
    return {**data, "zz_unknown_field": True}


@st.composite
def job_file_text(draw) -> tuple[bytes, dict | None]:
    """(the file's bytes, the mapping it holds when it is a well-formed YAML mapping)."""
    kind = draw(st.integers(0, 5))
    if kind <= 2:
        data = draw(broken_job_file())
        text = json.dumps(data) if kind == 0 else yaml.safe_dump(data, allow_unicode=True)
        return text.encode("utf-8", "surrogatepass"), data
    if kind == 3:
        return draw(st.sampled_from(YAML_TRAPS)).encode(), None
    if kind == 4:
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass"), None
    return draw(st.binary(max_size=100)), None


def _parsed(raw: bytes) -> object:
    """What `tpuq validate` reads from the file (the generator's mapping may differ: JSON's surrogate escapes)."""
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except Exception:  # noqa: BLE001 - not YAML, not text: refused before the schema
        return None


def _schema_field(data: dict | None) -> str | None:
    """The field a refused well-formed job file names (None: refused before the schema, or not a job file)."""
    if not isinstance(data, dict) or "tpus" in data or not ("jobs" in data or "command" in data):
        return None
    try:
        JobFile.model_validate(data)
    except Exception as e:  # noqa: BLE001
        return describe_validation_error(e)[0] if hasattr(e, "errors") else None
    return None


# How `tpuq.cli.app.main` prints an exception it did not expect: `error: KeyError: ...`.
UNEXPECTED = re.compile(r"^error: ([A-Za-z_][A-Za-z0-9_]*(Error|Exception|Warning|Exit|Interrupt)|StopIteration): ")


def test_tpuq_validate_refuses_malformed_job_files(bed, tmp_path, monkeypatch):
    monkeypatch.delenv("TPUQ_DEBUG", raising=False)
    path = tmp_path / "job.yaml"

    @budget(JOB_FILES)
    @given(file=job_file_text())
    # JSON's escaped surrogate pair is one character once read: the field named is the one the file holds.
    @example(file=(b'{"jobs": [{"tpu": "v4-8", "command": "x", "\\ud800\\udc00": null}]}', None))
    # Found by benchmarks/fuzz.py, fixed: an env name with a line break cut the one error line after the field.
    @example(file=(b'{"jobs": [{"tpu": "v4-8", "command": "x", "env": {"\\r\\n": null}}]}', None))
    def fuzz(file):
        raw, data = file
        path.write_bytes(raw)
        out, err = io.StringIO(), io.StringIO()
        bed.sent["tpuq validate"] += 1
        with redirect_stdout(out), redirect_stderr(err):
            rc = tpuq_main(["validate", str(path)])
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        if rc == 0:  # a garbage text that is a valid file after all (a fleet, a job)
            bed.outcomes["validate ok"] += 1
            return
        assert rc in (1, 2) and len(lines) == 1 and lines[0].startswith("error:"), (rc, err.getvalue(), raw[:300])
        assert not UNEXPECTED.match(lines[0]), (lines[0], raw[:300])  # a crash, caught at the boundary
        field = _schema_field(_parsed(raw))
        assert field is None or field in lines[0], (field, lines[0])
        bed.outcomes["validate error line"] += 1

    fuzz()


@st.composite
def upload(draw) -> tuple[str, bytes]:
    """(an object name under submit/ that GCS accepts, the job file's bytes)."""
    stem = draw(st.one_of(st.sampled_from(["job", "a/b/job", "..", "x/../../y", "$(id)", "日本"]),
                          p.SMALL_HOSTILE_STRINGS))
    name = f"submit/{stem}{draw(st.sampled_from(['.yaml', '.yml', '.json']))}"
    raw, _ = draw(job_file_text())
    return name, raw


def _gcs_name_ok(name: str) -> bool:
    """GCS object names: 1-1024 bytes of UTF-8, no carriage return or line feed."""
    try:
        return 0 < len(name.encode("utf-8")) <= 1024 and "\r" not in name and "\n" not in name
    except UnicodeEncodeError:
        return False


def _refused_file(raw: bytes, name: str) -> bool:
    try:
        parse_job_file(raw.decode("utf-8"), RUNNER_BUCKET, name, "1")
    except (UnicodeDecodeError, Permanent):
        return True
    except Exception:  # noqa: BLE001 - the push shows whether it is handled
        return True
    return False


def test_bucket_uploads_get_a_result_file_beside_them(bed):
    sub = _sub("scheduler/push/gcs-submit")

    @budget(UPLOADS)
    @given(item=upload().filter(lambda u: _gcs_name_ok(u[0])), generation=st.integers(1, 2 ** 62))
    def fuzz(item, generation):
        name, raw = item
        if not _refused_file(raw, name):
            raw += b"\nzz_unknown_field: 1\n"
        assert _refused_file(raw, name)
        bed.gcs.bucket(RUNNER_BUCKET).blob(name).upload_from_string(raw)
        event = {"bucket": RUNNER_BUCKET, "name": name, "generation": str(generation), "size": len(raw)}
        message_id = bed.message_id()
        kind = bed.push("scheduler submit/ upload", sub, envelope(json.dumps(event).encode(), message_id, sub),
                        message_id, frozenset({"dead_letter"}))
        if kind == "crash":
            return
        result = json.loads(bed.gcs.objects(RUNNER_BUCKET)[name + RESULT_SUFFIX])
        assert result.get("error") and result["object"] == name and "job_ids" not in result, result
        bed.outcomes["result file"] += 1

    fuzz()
    settled(bed)


# ------------------------------------------------------------------ the tally

FUZZ_TESTS = ("test_malformed_messages_are_dead_lettered", "test_hostile_but_valid_messages_touch_nothing_stored",
              "test_requests_that_are_no_push_get_400", "test_tpuq_validate_refuses_malformed_job_files",
              "test_bucket_uploads_get_a_result_file_beside_them")
FUZZ_TOTAL = (MESSAGES_PER_PATH * len(SUBS) + HOSTILE_PER_ENTRY * len(HOSTILE)
              + ENVELOPES_PER_SERVICE * len(topology.SERVICES) + JOB_FILES + UPLOADS)


def test_every_entry_point_was_fuzzed(bed, request):
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    if not set(FUZZ_TESTS) <= selected:
        pytest.skip("only part of the fuzz suite was selected")
    total = sum(bed.sent.values())
    print(f"\nfuzz total: {total} payloads; outcomes {dict(bed.outcomes)}")
    expected = {f"{s.service}{s.path}" for s in SUBS} | {f"{e} hostile" for e in HOSTILE} | {f"{s} envelope" for s in topology.SERVICES} \
        | {"tpuq validate", "scheduler submit/ upload"}
    assert expected <= set(bed.sent), sorted(expected - set(bed.sent))
    assert total >= min(10_000, FUZZ_TOTAL), dict(bed.sent)
    assert bed.outcomes["crash"] == 0
    settled(bed)
