"""The fuzz bed: the four services' real entry points (functions-framework apps over `tpuq.runtime.entrypoints.<service>`)
on one in-memory Firestore, Pub/Sub publisher and GCS, with a seeded store, and the judge of every answer.

`Bed.push(...)` posts one body to one push path and classifies the answer:
- `dead_letter`: 200, and `dead_letters/{subscription:message}` holds the message with a field and a reason
  (for the `jobs` topic, a job id it named and that was free is stored as `rejected` with the reason);
- `bad_envelope`: 400, for a request that is not a Pub/Sub push at all;
- `accepted`: 204, only allowed for a payload its topic model accepts (the handler found nothing to do);
- `retry`: 503 from a typed `tpuq.contracts.errors.Retryable` (the adapter's "retry" body), only allowed where the
  caller says so;
- anything else, 500 above all, is a crash: `Bed.crashes` keeps it and the test fails.

`Bed.check_store()` then asserts that every seeded document is exactly as it was, and that every new document is
one Firestore would store (ids and strings it accepts, under its 1 MiB document limit) in a collection where a
refusal may write: dead letters, delivery counters and rejected jobs.
"""

from __future__ import annotations

import base64
import copy
import json
import importlib
import logging
import re
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import functions_framework

from tpuq.contracts import store, topology
from tpuq.runtime.auth import PushAuth
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import JobState
from tpuq.runtime.entrypoints import source_file
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory.firestore import MAX_DOCUMENT_BYTES, document_size
from tests.fuzz.memgcs import MemoryGcs
from tests.helpers import push_envelope
from tests.scheduler.conftest import active, fleet_file, memory_clients

RUNNER_BUCKET = "tpuq-runner"
SEEDED_FLEET = "test"
SEED_RUNNING, SEED_PENDING, SEED_TPU = "seed-running", "seed-pending", "seed-tpu"
SEEDED_JOB_IDS = (SEED_RUNNING, SEED_PENDING)
FIRESTORE_ID_LIMIT = 1500  # bytes of a document id
_RESERVED_ID = re.compile(r"^__.*__$")

# Where a refusal may add documents: its dead letter, the delivery counter of a deliberate retry, a rejected job.
REFUSAL_COLLECTIONS = {store.DEAD_LETTERS, store.DELIVERIES, store.JOBS}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def firestore_id_problem(doc_id: str) -> str | None:
    """Why Firestore would refuse `doc_id` as a document or collection id, or None."""
    try:
        size = len(doc_id.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if not doc_id or doc_id in (".", "..") or "/" in doc_id or _RESERVED_ID.match(doc_id) or size > FIRESTORE_ID_LIMIT:
        return "not a Firestore id"
    return None


def _strings_problem(value: Any, where: str = "") -> str | None:
    """A string Firestore cannot store (not UTF-8: a lone surrogate), anywhere in a document."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where or 'value'} is not valid UTF-8"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            problem = _strings_problem(k, f"{where}.{k!r}") or _strings_problem(v, f"{where}.{k!r}")
            if problem:
                return problem
    if isinstance(value, list):
        for i, v in enumerate(value):
            problem = _strings_problem(v, f"{where}[{i}]")
            if problem:
                return problem
    return None


@dataclass
class Crash:
    entry: str
    status: int
    answer: str
    body: str

    def __str__(self) -> str:
        return f"CRASH {self.entry}: HTTP {self.status} {self.answer[:300]!r} for {_readable(self.body)[:800]!r}"


def _readable(body: str) -> str:
    """The push body with its message's data decoded, for the report of a crash."""
    try:
        message = json.loads(body)["message"]
        return f"data={base64.b64decode(message['data']).decode('utf-8', 'replace')} attributes={message.get('attributes')}"
    except Exception:  # noqa: BLE001 - not an envelope: as it is
        return body


@dataclass
class Bed:
    clients: Any
    publisher: Any
    gcs: MemoryGcs
    apps: dict[str, Any]
    seeded: dict[str, dict] = field(default_factory=dict)
    sent: Counter = field(default_factory=Counter)  # entry point -> payloads sent
    outcomes: Counter = field(default_factory=Counter)  # outcome kind -> count
    crashes: list[Crash] = field(default_factory=list)
    _ids: int = 0

    @property
    def db(self):
        return self.clients.firestore

    def message_id(self) -> str:
        self._ids += 1
        return f"fz{self._ids}"

    # ---------------------------------------------------------------- pushing
    def post(self, service: str, path: str, body: bytes, headers: dict[str, str] | None = None):
        r = self.apps[service].post(path, data=body, headers={"Content-Type": "application/json", **(headers or {})})
        return r.status_code, r.get_data(as_text=True)

    def push(self, entry: str, sub: topology.Subscription, body: bytes, message_id: str | None,
             allowed: frozenset[str], job_id: str | None = None) -> str:
        """Post `body` to `sub`'s service and path; returns the outcome kind. `allowed`: the kinds the caller
        accepts for this payload (a crash is never one)."""
        self.sent[entry] += 1
        status, answer = self.post(sub.service, sub.path, body)
        kind = self._judge(sub, status, answer, message_id, job_id)
        if kind not in allowed:
            crash = Crash(entry, status, f"[{kind}] {answer}", body.decode("utf-8", "replace"))
            self.crashes.append(crash)
            self.outcomes["crash"] += 1
            raise AssertionError(str(crash))  # inside the example: hypothesis shrinks it and prints it
        self.outcomes[kind] += 1
        return kind

    def _judge(self, sub: topology.Subscription, status: int, answer: str, message_id: str | None,
               job_id: str | None) -> str:
        if status == 400:
            return "bad_envelope"
        if status == 204:
            return "accepted"
        if status == 503 and answer == "retry":
            return "retry"
        if status != 200 or message_id is None:
            return "crash"
        record = self.dead_letter(sub, message_id)
        if record is None or not record.get("field") or not record.get("reason"):
            return "unrecorded"
        if sub.topic == "jobs" and job_id and job_id not in self.seeded_job_ids():
            job = self.db.collection(store.JOBS).document(job_id).get().to_dict() or {}
            if job.get("state") == JobState.rejected and job.get("reason"):
                return "rejected_job"
        return "dead_letter"

    def dead_letter(self, sub: topology.Subscription, message_id: str) -> dict | None:
        return self.db.collection(store.DEAD_LETTERS).document(store.doc_id(sub.name, message_id)).get().to_dict()

    def seeded_job_ids(self) -> set[str]:
        return {p.split("/")[1] for p in self.seeded if p.startswith(f"{store.JOBS}/")}

    # ---------------------------------------------------------------- the store
    def dump(self) -> dict[str, dict]:
        """Every document, by path. Read from the stand-in's own table, so that a write to any path (a
        subcollection of a seeded job, a collection no service uses) shows."""
        db = self.db
        with db._lock:
            return {f"{col}/{doc_id}": copy.deepcopy(stored.data)
                    for col, docs in db._collections.items() for doc_id, stored in docs.items()}

    def check_store(self) -> list[str]:
        """What is wrong with the store now: seeded documents changed, new documents Firestore would refuse or
        that a refusal must not write."""
        problems = []
        now = self.dump()
        for path, data in self.seeded.items():
            if now.get(path) != data:
                problems.append(f"seeded {path} changed: {data!r} -> {now.get(path)!r}")
        for path, data in now.items():
            if path in self.seeded:
                continue
            parts = path.split("/")
            bad = next((p for p in parts if firestore_id_problem(p)), None)
            if bad is not None:
                problems.append(f"new document at {path!r}: {firestore_id_problem(bad)}: {bad[:80]!r}")
            if len(parts) != 2 or parts[0] not in REFUSAL_COLLECTIONS:
                problems.append(f"new document {path[:200]!r} outside {sorted(REFUSAL_COLLECTIONS)}")
            elif parts[0] == store.JOBS and data.get("state") != JobState.rejected:
                problems.append(f"new job {path[:200]!r} in state {data.get('state')!r}, not rejected")
            problem = _strings_problem(data)
            if problem:
                problems.append(f"{path[:200]!r}: {problem}")
            size = document_size(path, data)  # the in-memory store refuses such a write too: a second look
            if size > MAX_DOCUMENT_BYTES:
                problems.append(f"{path[:200]!r}: over Firestore's 1 MiB document limit ({size} bytes)")
        return problems


def _app(service: str, clients) -> Any:
    """The service's entry module through functions-framework, its Service bound to `clients`, push auth off."""
    source = str(source_file(service))
    app = functions_framework.create_app("handle", source, "http")
    entry = sys.modules[Path(source).stem]  # functions-framework registers a source under its file's stem
    assert Path(entry.__file__).resolve() == Path(source).resolve()
    service = importlib.import_module(f"tpuq.{service}.handlers").build_service(clients.settings, clients)
    service.push_auth = PushAuth.from_env({})  # off, as on the local stack
    entry.ENTRY.use(service)
    return app.test_client()


def envelope(data: bytes, message_id: str, sub: topology.Subscription, attributes: dict | None = None) -> bytes:
    return json.dumps(push_envelope(data, message_id, sub.name, attributes)).encode()


def _seed(bed: Bed) -> None:
    """Through the scheduler's own entry point: a fleet, an idle-then-busy TPU, a running and a pending job."""
    save_fleet(bed.db, fleet_file(), utc(2026, 1, 1))
    subs = {s.path: s for s in topology.subscriptions_for("scheduler")}

    def deliver(path: str, message: dict) -> None:
        sub = subs[path]
        body = envelope(json.dumps(message).encode(), bed.message_id(), sub)
        status, answer = bed.post("scheduler", path, body)
        assert status == 204, (status, answer)

    deliver("/push/fleet-events", json.loads(active(SEED_TPU).model_dump_json(exclude_none=True)))
    deliver("/push/jobs", {"id": SEED_RUNNING, "tpu": "v4-8", "command": "python train.py"})
    assignment = json.loads(bed.publisher.take(bed.clients.settings.topic_path("assignments"))[-1].data)
    deliver("/push/attempt-events", {"kind": "started", "job_id": SEED_RUNNING, "attempt": assignment["attempt"],
                                     "attempt_id": assignment["attempt_id"], "node": assignment["node"],
                                     "at": "2026-01-01T00:00:00Z"})
    deliver("/push/jobs", {"id": SEED_PENDING, "tpu": "v5litepod-8", "command": "echo waiting"})  # no such entry
    bed.seeded = bed.dump()
    states = {p: d.get("state") for p, d in bed.seeded.items() if p.count("/") == 1}
    assert states[f"{store.JOBS}/{SEED_RUNNING}"] == JobState.running, states
    assert states[f"{store.TPUS}/{SEED_TPU}"] == "busy", states


def make_bed() -> Bed:
    settings = Settings(project="tpuq-local", runner_bucket=RUNNER_BUCKET)
    gcs = MemoryGcs()
    gcs.create_bucket(RUNNER_BUCKET)
    clients, publisher = memory_clients(settings, storage=gcs)
    bed = Bed(clients, publisher, gcs, {s: _app(s, clients) for s in topology.SERVICES})
    _seed(bed)
    return bed


@contextmanager
def quiet():
    """The services log every refusal at WARNING; ten thousand of them cost more than the pushes. Crashes are
    judged by status and store, not by log lines."""
    logger = logging.getLogger("tpuq")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
