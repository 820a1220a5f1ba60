"""The document contracts (`tpuq.contracts.documents`): one owner for every stored state, and the state machines' tables.

The scans read the package's source: a state, or a field name only one collection's documents use, written as a
string literal anywhere but `tpuq.contracts.documents` is a second owner of that name, and renaming it would break it silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpuq_dev
from tests.layout import REPO, production_modules
from tpuq.contracts import documents as D
from tpuq.contracts.jobstate import TRANSITIONS, JobEvent, allowed_events

CONTRACTS = Path(D.__file__).parent  # the tpuq.contracts.documents package: one module per collection
DEV_PACKAGE = Path(tpuq_dev.__file__).parent  # the fake TPU, the local stack and the demo read the same states
# A stdlib-only program shipped to the workers: it cannot import tpuq, and its own status words are its
# protocol with the executor (`tpuq.executor.executor` reads them), not stored states.
WORKER_PROGRAM = REPO / "services" / "executor" / "worker"

STORED_ENUMS = (D.JobState, D.AttemptState, D.TpuState, D.QueuedResourceState, D.ClaimerQrState,
                D.TpuNodeState, D.RequestStatus, D.ExecutionState)
STATE_VALUES = {m.value for e in STORED_ENUMS for m in e}
# The Cloud TPU API's state names mean nothing else anywhere: a literal of one is a state wherever it stands.
# (UNKNOWN is also an RPC code, which the fake's error catalogue writes.)
API_STATE_NAMES = {m.value for e in (D.QueuedResourceState, D.ClaimerQrState, D.TpuNodeState, D.TpuHealth,
                                      D.SymptomType, D.MaintenanceType, D.MaintenanceStatus) for m in e} - {"UNKNOWN"}
STATE_FIELDS = {"state", "status", "tpu_state"}


def _sources() -> list[Path]:
    sources = [*production_modules().values(), *DEV_PACKAGE.rglob("*.py")]
    return sorted(p for p in sources if CONTRACTS not in p.parents and WORKER_PROGRAM not in p.parents)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants of a literal, or of a tuple / list / set / frozenset({...}) of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _strings(e)]
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("frozenset", "set", "tuple") and node.args:
        return _strings(node.args[0])
    return []


def _is_state_field(node: ast.AST) -> bool:
    """`x.state`, `x["state"]`, `x.get("state")` (or status)."""
    if isinstance(node, ast.Attribute):
        return node.attr in STATE_FIELDS
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in STATE_FIELDS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        return isinstance(first, ast.Constant) and first.value in STATE_FIELDS
    return False


def state_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every state written as a string: anywhere for the API's state names; compared with a
    state field, stored under one, or queried on one for the rest (their words also name outcomes and kinds)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: set[tuple[int, str]] = set()

    def flag(constants):
        found.update((c.lineno, c.value) for c in constants if c.value in STATE_VALUES)

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in API_STATE_NAMES:
                found.add((node.lineno, node.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_state_field(s) for s in sides):
                flag([c for s in sides for c in _strings(s)])
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value in STATE_FIELDS and value is not None:
                    flag(_strings(value))
        elif isinstance(node, ast.Call) and len(node.args) >= 3 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in STATE_FIELDS:  # FieldFilter("state", "==", ...), .where("state", ...)
            flag(_strings(node.args[2]))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):  # a set of states: TERMINAL = ("succeeded", ...)
            words = _strings(node)
            if len(words) >= 2 and len(words) == len(node.elts) and all(w.value in STATE_VALUES for w in words):
                flag(words)
    for node in tree.body:  # a module's own name for a state: GONE = "gone"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            flag(_strings(node.value))
    return sorted(found)


def test_no_state_literal_outside_the_contracts():
    assert WORKER_PROGRAM.is_dir(), "the exemption must name the worker program where it is"
    offences = [f"{path.relative_to(REPO)}:{line}: {value!r}"
                for path in _sources() for line, value in state_literals(path.read_text())]
    assert offences == [], "use the enums of tpuq.contracts.documents:\n" + "\n".join(offences)


@pytest.mark.parametrize("source", [
    'if tpu.get("state") == "idle": pass',
    'x = doc["state"] in ("gone", "deleting")',
    'q.where(filter=FieldFilter("state", "in", ["assigned", "running"]))',
    'fields = {"state": "pending"}',
    'DEAD = frozenset({"SUSPENDED", "FAILED"})',
    'class QrState(str, Enum):\n    ACTIVE = "ACTIVE"',
    'obs = Observation.found("CREATING")',
    'TERMINAL = ("succeeded", "failed", "cancelled", "rejected")',
    'TPU_IDLE, TPU_BUSY = "idle", "busy"',
    'GONE = "gone"',
])
def test_the_scan_finds_each_kind_of_state_literal(source):
    assert state_literals(source), source


@pytest.mark.parametrize("source", [
    '"""A docstring may say ACTIVE."""',
    'if r.value.get("kind") == "cancelled": pass',  # the worker program's reply, not a stored state
    'if stored.get("ended"): pass',  # a field named like a state
    'RPC_CODES = {"UNKNOWN": 500}',
    'class AttemptOutcome(str, Enum):\n    failed = "failed"',  # a message's own vocabulary
    'log.info("%s %s", name, "gone")',
])
def test_the_scan_leaves_other_words_alone(source):
    assert state_literals(source) == []


def test_the_fake_tpu_runs_the_same_state_enums():
    from tpuq_dev.capacitymodel import model

    assert model.QrState is D.QueuedResourceState and model.NodeState is D.TpuNodeState


def test_the_api_enums_are_google_s():
    from google.cloud import tpu_v2

    assert {s.name for s in tpu_v2.QueuedResourceState.State} - {"STATE_UNSPECIFIED"} == {
        m.value for m in D.QueuedResourceState}
    assert {s.name for s in tpu_v2.Node.State} - {"STATE_UNSPECIFIED"} == {m.value for m in D.TpuNodeState}
    assert not {m.value for m in D.ClaimerQrState} & {s.name for s in tpu_v2.QueuedResourceState.State}


def test_fleet_event_kinds_are_queued_resource_states():
    from tpuq.contracts.messages import FleetEventKind

    stored = {m.value for m in D.QueuedResourceState} | {m.value for m in D.ClaimerQrState}
    # NODE_HEALTH, the one kind that is no queued-resource state: a node's health or maintenance changed.
    assert {k.value for k in FleetEventKind} - stored == {FleetEventKind.node_health.value}


def test_the_node_health_enums_are_google_s():
    """Health and symptoms against google-cloud-tpu; maintenance against the tpu.v2 discovery document, since
    tpu_v2 has no UpcomingMaintenance message (its Node drops the field: see tpuq.claimer.tpuapi)."""
    import json
    from pathlib import Path

    import googleapiclient
    from google.cloud import tpu_v2

    assert {h.name for h in tpu_v2.Node.Health} - {"HEALTH_UNSPECIFIED"} == {m.value for m in D.TpuHealth}
    assert {s.name for s in tpu_v2.Symptom.SymptomType} - {"SYMPTOM_TYPE_UNSPECIFIED"} == {
        m.value for m in D.SymptomType}
    assert "upcoming_maintenance" not in tpu_v2.Node.meta.fields
    doc = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache/documents/tpu.v2.json").read_text())
    schema = doc["schemas"]["UpcomingMaintenance"]["properties"]
    assert set(schema["type"]["enum"]) == {m.value for m in D.MaintenanceType}
    assert set(schema["maintenanceStatus"]["enum"]) == {m.value for m in D.MaintenanceStatus}
    node = doc["schemas"]["Node"]["properties"]
    assert set(node["health"]["enum"]) - {"HEALTH_UNSPECIFIED"} == {m.value for m in D.TpuHealth}
    assert {"health", "healthDescription", "symptoms", "upcomingMaintenance"} <= set(node)


def test_the_two_live_tpu_sets_keep_their_two_meanings():
    assert D.TPU_STATES_IN_SERVICE == {D.TpuState.idle, D.TpuState.busy}  # the janitor's pool
    assert D.TPU_STATES_HOLDING_A_SLICE == D.TPU_STATES_IN_SERVICE | {D.TpuState.deleting}  # the scheduler's cap


def test_terminal_job_states_are_exactly_those_the_transition_table_never_leaves():
    never_left = {s for s in D.JobState if not allowed_events(s)}
    assert D.TERMINAL_JOB_STATES == never_left
    assert all(s.terminal == (s in never_left) for s in D.JobState)
    assert not any(TRANSITIONS[(s, e)] in D.JOB_STATES_ON_A_TPU for s, e in TRANSITIONS if e is JobEvent.cancel)


def test_short_node_name():
    assert D.short_node_name("projects/p/locations/z/nodes/my-tpu") == "my-tpu"
    assert D.short_node_name("projects/p/locations/z/queuedResources/qr-1") == "qr-1"
    assert D.short_node_name("my-tpu") == "my-tpu"


def test_claimer_records_round_trip_through_their_documents():
    from datetime import datetime, timezone

    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    qr = D.QrRecord("tq-r-z", "f", "p", "r", "e", "z", "v4-8", True, 0, D.ClaimerQrState.REQUESTED, now, now,
                    endpoints=(D.WorkerEndpoint(worker_id=0, ip="10.0.0.2"),))
    doc = D.qr_to_doc(qr)
    assert doc["live"] and doc["name"] == "projects/p/locations/z/queuedResources/tq-r-z"
    assert D.qr_from_doc(doc) == qr and D.qr_from_doc(doc).pending
    assert not D.qr_from_doc({**doc, "state": D.ClaimerQrState.GONE.value}).live
    request = D.RequestRecord("r", "f", ("v4-8",), generations={"z": 1})
    assert D.request_from_doc(D.request_to_doc(request)) == request and request.open
    target = D.TargetRecord("f", "z", "v4-8", capacity_failures=2)
    assert D.target_from_doc(D.target_to_doc(target), None) == target
    status = D.FleetStatus("f", blocked="billing is disabled", blocked_version="v1")
    assert D.status_from_doc(D.status_to_doc(status)) == status and status.is_blocked("v1")


def test_an_execution_s_end_is_read_only_once_published():
    from datetime import datetime, timezone

    end = D.ExecutionEnd("preempted", "node preempted", datetime(2026, 12, 1, tzinfo=timezone.utc))
    assert D.ExecutionEnd.from_doc({"state": D.ExecutionState.started.value, **end.to_doc()}) == end
    assert D.ExecutionEnd.from_doc({"state": D.ExecutionState.started.value, "ended": False}) is None
    assert D.ExecutionEnd.from_doc(None) is None
    assert D.execution_doc_id("job-1", 3) == "job-1:3"


# ------------------------------------------------------------------ the job and attempt views


JOB_ONLY_FIELDS = {"capacity_request", "capacity_requests", "cancel_requested", "cancel_reason", "priority_rank",
                   "infra_failures", "not_before", "submit_time", "assignment_republished_at", "assignment_republishes",
                   "assigned_at", "finished_at"}  # names no other document, message or file uses: a literal of one is the job's
# The same for tpus/{node} and executions/{job}:{attempt}.
TPU_ONLY_FIELDS = {"idle_since", "busy_since", "deleting_since", "delete_reason", "gone_at", "gone_reason",
                   "quarantined", "quarantine_reason", "host_keys"}
EXECUTION_ONLY_FIELDS = {"received_at", "start_lease_until", "start_lease_by", "probed_at", "unreachable_since",
                         "ended_by"}
OWNED_FIELDS = ((D.JobDoc, JOB_ONLY_FIELDS), (D.TpuDoc, TPU_ONLY_FIELDS), (D.ExecutionDoc, EXECUTION_ONLY_FIELDS))


def field_literals(source: str, names: set[str] = JOB_ONLY_FIELDS) -> list[tuple[int, str]]:
    """(line, literal) of one of `names` read or written as a string: `x["not_before"]`,
    `x.get("cancel_requested")`, `{"submit_time": ...}`, `FieldFilter("capacity_request.id", ...)`."""
    def named(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
            node.value.split(".", 1)[0] in names

    found = set()
    for node in ast.walk(ast.parse(source)):
        keys: list = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", None) != "field":
            keys = [node.args[0]]  # (JobDoc.field("submit_time") is the checked way to name one)
        found.update((k.lineno, k.value) for k in keys if named(k))
    return sorted(found)


@pytest.mark.parametrize("view, names", OWNED_FIELDS, ids=lambda v: getattr(v, "__name__", ""))
def test_owned_fields_are_their_view_s(view, names):
    from dataclasses import fields

    assert names <= {f.name for f in fields(view)}


def test_each_owned_field_has_one_owner():
    owned = [names for _, names in OWNED_FIELDS]
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1:])


@pytest.mark.parametrize("view, names", OWNED_FIELDS, ids=lambda v: getattr(v, "__name__", ""))
def test_no_owned_field_literal_outside_the_contracts(view, names):
    offences = [f"{path.relative_to(REPO)}:{line}: {value!r}"
                for path in _sources() for line, value in field_literals(path.read_text(), names)]
    name = view.__name__
    assert offences == [], f"read {view.COLLECTION} through {name}.from_doc or {name}.field, write them with " \
                           f"{name}.fields:\n" + "\n".join(offences)


@pytest.mark.parametrize("source", [
    'x = job["not_before"]',
    'if job.get("cancel_requested"): pass',
    'fields = {"submit_time": now}',
    'q.where(filter=FieldFilter("capacity_request.id", "==", r))',
    'q.order_by("priority_rank")',
])
def test_the_job_field_scan_finds_each_kind(source):
    assert field_literals(source), source


@pytest.mark.parametrize("source, names", [
    ('freed = {"state": s, "idle_since": now}', TPU_ONLY_FIELDS),
    ('if doc.get("quarantined"): pass', TPU_ONLY_FIELDS),
    ('ref.set({"host_keys": DELETE_FIELD}, merge=True)', TPU_ONLY_FIELDS),
    ('until = execution.get("start_lease_until")', EXECUTION_ONLY_FIELDS),
    ('ref.set({"probed_at": now}, merge=True)', EXECUTION_ONLY_FIELDS),
])
def test_the_tpu_and_execution_field_scans_find_each_kind(source, names):
    assert field_literals(source, names), source


def test_the_job_field_scan_leaves_keywords_and_other_words_alone():
    assert field_literals('JobDoc.fields(not_before=None, cancel_requested=False)\nx = d["zone"]\n'
                          'q.order_by(JobDoc.field("submit_time"))') == []
    assert field_literals('TpuDoc.fields(idle_since=now)\nx = d[TpuDoc.field("gone_at")]\nslot.idle_since',
                          TPU_ONLY_FIELDS) == []


def _now():
    from datetime import datetime, timezone

    return datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_a_stored_job_reads_back_as_its_view():
    from tpuq.contracts.jobspec import PublishedJob
    from tpuq.scheduler.intake import job_document

    stored = job_document(PublishedJob.model_validate({"id": "j1", "tpu": ["v4-8"], "command": "x"}), "j1", "cli",
                          "m1", _now())
    job = D.JobDoc.from_doc(stored)
    assert job.state is D.JobState.pending and job.id == "j1" and job.submit_time == _now()
    assert job.types == ("v4-8",) and job.spec_tpu == ["v4-8"] and job.attempt == 0 and not job.terminal
    # Writing the view's fields back gives the same document: nothing renamed, nothing added.
    assert D.JobDoc.fields(**{k: getattr(job, k) for k in stored}) == {**stored, "types": ("v4-8",)}


@pytest.mark.parametrize("doc, expected", [
    # rejected at intake: no spec, no counters
    ({"id": "j", "state": "rejected", "reason": "tpu: unknown"},
     {"spec": None, "attempt": 0, "preemptions": 0, "capacity_request": None, "cancel_requested": False,
      "types": (), "capacity_request_id": None, "terminal": True}),
    # nulls read as the defaults
    ({"id": "j", "state": "pending", "attempt": None, "capacity_requests": None, "cancel_requested": None},
     {"attempt": 0, "capacity_requests": 0, "cancel_requested": False}),
    # an open request, and a field the view does not know (ignored)
    ({"id": "j", "state": "pending", "capacity_request": {"id": "r-j-1", "entry_id": "e"}, "later": 1},
     {"capacity_request_id": "r-j-1", "capacity_request_entry": "e"}),
])
def test_a_job_view_tolerates_what_real_documents_lack(doc, expected):
    job = D.JobDoc.from_doc(doc)
    assert {k: getattr(job, k) for k in expected} == expected


def test_a_job_without_an_id_takes_its_document_s():
    assert D.JobDoc.from_doc({"state": "pending"}, "j7").id == "j7"


@pytest.mark.parametrize("view, doc, words", [
    (D.JobDoc, {"id": "j1", "state": "paused"}, ["jobs/j1", "'paused'", "pending"]),
    (D.JobDoc, {"id": "j1"}, ["jobs/j1", "None"]),
    (D.AttemptDoc, {"attempt": 2, "state": "lost"}, ["attempts/2", "'lost'", "ended"]),
])
def test_an_unknown_state_is_a_clear_error(view, doc, words):
    from tpuq.contracts.errors import Permanent

    with pytest.raises(Permanent) as e:
        view.from_doc(doc)
    assert e.value.field == "state"
    assert all(w in str(e.value) for w in words), str(e.value)


def test_partial_writes_name_only_declared_fields_and_store_plain_values():
    fields = D.JobDoc.fields(state=D.JobState.cancelled, cancel_requested=False)
    assert fields == {"state": "cancelled", "cancel_requested": False}
    assert type(fields["state"]) is str  # the enum's value, as the writers stored it before the views
    with pytest.raises(TypeError, match="'cancelled_at'"):
        D.JobDoc.fields(cancelled_at=None)
    with pytest.raises(TypeError, match="'exit_code'"):
        D.AttemptDoc.fields(exit_code=0)


def test_query_field_names_are_checked():
    assert D.JobDoc.field("submit_time") == "submit_time"
    assert D.JobDoc.field("capacity_request", "entry_id") == "capacity_request.entry_id"
    with pytest.raises(AttributeError, match="'submitted_at'"):
        D.JobDoc.field("submitted_at")


def test_an_attempt_reads_back_as_its_view():
    from tpuq.contracts.messages import AttemptOutcome

    stored = D.AttemptDoc.fields(attempt=2, attempt_id="j1-2", tpu="n1", state=D.AttemptState.assigned,
                                 outcome=None, assigned_at=_now())
    ended = {**stored, **D.AttemptDoc.fields(state=D.AttemptState.ended, outcome=AttemptOutcome.preempted,
                                             detail="node preempted", ended_at=_now())}
    attempt = D.AttemptDoc.from_doc(ended, "2")
    assert (attempt.attempt, attempt.state, attempt.outcome, attempt.detail) == (
        2, D.AttemptState.ended, "preempted", "node preempted")
    assert D.AttemptDoc.fields(**{k: getattr(attempt, k) for k in ended}) == ended
    assert D.AttemptDoc.from_doc({"state": "running"}, "3").attempt == 3  # its number from its document id


def test_claimer_documents_are_what_asdict_made_and_share_nothing_mutable_with_the_record():
    from dataclasses import asdict
    from datetime import datetime, timezone

    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    health = D.NodeHealth.from_api({"health": "UNHEALTHY_TENSORFLOW", "healthDescription": "the ML stack failed"})
    qr = D.QrRecord("tq-r-z", "f", "p", "r", "e", "z", "v4-8", True, 2, "ACTIVE", now, now, node="n",
                    endpoints=(D.WorkerEndpoint(worker_id=0, ip="10.0.0.2"),), node_health=health)
    expected = asdict(qr) | {"endpoints": [e.model_dump() for e in qr.endpoints], "node_health": health.to_doc(),
                             "slice_nodes": [], "name": qr.name, "live": True}
    assert D.qr_to_doc(qr) == expected
    request = D.RequestRecord("r", "f", ("v4-8", "v5litepod-8"), zones=("z",), job_ids=("j",), generations={"z": 1})
    doc = D.request_to_doc(request)
    assert doc == {**asdict(request), "types": ["v4-8", "v5litepod-8"], "regions": [], "zones": ["z"],
                   "job_ids": ["j"], "slices": []}
    doc["generations"]["z"] = 5
    assert request.generations == {"z": 1}
