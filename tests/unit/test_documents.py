"""The document contracts (`tpuq.documents`): one owner for every stored state, and the state machines' tables.

The scan reads the package's source: a state written as a string literal anywhere but `tpuq.documents` is a
second owner of that name, and renaming the state would break it silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpuq_dev
from tpuq import documents as D
from tpuq.jobstate import TRANSITIONS, JobEvent, allowed_events

PACKAGE = Path(D.__file__).parent
DEV_PACKAGE = Path(tpuq_dev.__file__).parent  # the fake TPU, the local stack and the demo read the same states
CONTRACTS = PACKAGE / "documents.py"
# A stdlib-only program shipped to the workers: it cannot import tpuq, and its own status words are its
# protocol with the executor (`tpuq.executor.executor` reads them), not stored states.
WORKER_PROGRAM = PACKAGE / "executor" / "worker"

STORED_ENUMS = (D.JobState, D.AttemptState, D.TpuState, D.QueuedResourceState, D.ClaimerQrState,
                D.TpuNodeState, D.RequestStatus, D.ExecutionState)
STATE_VALUES = {m.value for e in STORED_ENUMS for m in e}
# The Cloud TPU API's state names mean nothing else anywhere: a literal of one is a state wherever it stands.
# (UNKNOWN is also an RPC code, which the fake's error catalogue writes.)
API_STATE_NAMES = {m.value for e in (D.QueuedResourceState, D.ClaimerQrState, D.TpuNodeState) for m in e} - {
    "UNKNOWN"}
STATE_FIELDS = {"state", "status", "tpu_state"}


def _sources() -> list[Path]:
    return sorted(p for root in (PACKAGE, DEV_PACKAGE) for p in root.rglob("*.py")
                  if p != CONTRACTS and WORKER_PROGRAM not in p.parents)


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
    offences = [f"{path.relative_to(PACKAGE.parents[1])}:{line}: {value!r}"
                for path in _sources() for line, value in state_literals(path.read_text())]
    assert offences == [], "use the enums of tpuq.documents:\n" + "\n".join(offences)


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
    from tpuq.capacitymodel import model

    assert model.QrState is D.QueuedResourceState and model.NodeState is D.TpuNodeState


def test_the_api_enums_are_google_s():
    from google.cloud import tpu_v2

    assert {s.name for s in tpu_v2.QueuedResourceState.State} - {"STATE_UNSPECIFIED"} == {
        m.value for m in D.QueuedResourceState}
    assert {s.name for s in tpu_v2.Node.State} - {"STATE_UNSPECIFIED"} == {m.value for m in D.TpuNodeState}
    assert not {m.value for m in D.ClaimerQrState} & {s.name for s in tpu_v2.QueuedResourceState.State}


def test_fleet_event_kinds_are_queued_resource_states():
    from tpuq.messages import FleetEventKind

    stored = {m.value for m in D.QueuedResourceState} | {m.value for m in D.ClaimerQrState}
    assert {k.value for k in FleetEventKind} <= stored


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
