"""The typed views of tpus/{node} and executions/{job}:{attempt} (`tpuq.contracts.documents.TpuDoc`, `ExecutionDoc`).

Every field a writer stores is one its view declares, and a stored document reads back as its view and writes back
unchanged: the views describe the documents deployments already hold, they do not reshape them.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.documents import ExecutionDoc, ExecutionEnd, TpuDoc, TpuState, WorkerEndpoint
from tpuq.executor import decide
from tpuq.contracts.messages import Assignment, FleetEvent, FleetEventKind
from tpuq.scheduler import lifecycle
from tpuq.scheduler.plan import Match

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
NODE = "projects/tpuq-local/locations/us-central2-b/nodes/n1"


def _event(kind: FleetEventKind = FleetEventKind.active) -> FleetEvent:
    return FleetEvent(kind=kind, fleet="test", queued_resource="projects/tpuq-local/locations/us-central2-b/"
                      "queuedResources/n1", request_id="r1", zone="us-central2-b", type="v4-8", node=NODE,
                      entry_id="v4", chips=4, hosts=1, endpoints=[WorkerEndpoint(worker_id=0, ip="10.0.0.2")], at=NOW)


def _tpu_writes() -> list[dict]:
    fresh = lifecycle.tpu_on_active(None, _event(), None, NOW)
    job = {"id": "j1", "state": "pending", "spec": {"id": "j1", "tpu": ["v4-8"], "command": "x"}}
    assigned = lifecycle.assignment(job, fresh, Match("j1", NODE, "v4-8", "us-central2-b", "us-central2", "v4"),
                                    "bucket", NOW)
    busy = {**fresh, **assigned.tpu}
    return [fresh, assigned.tpu, lifecycle.tpu_freed(busy, busy["attempt_id"], NOW, "preempted"),
            lifecycle.tpu_on_gone(None, _event(FleetEventKind.gone), NOW),
            TpuDoc.fields(host_keys={"0": "ssh-ed25519 AAAA"})]


def test_every_field_written_to_a_tpu_is_the_view_s_and_reads_back():
    for written in _tpu_writes():
        assert set(written) <= TpuDoc.field_names(), sorted(set(written) - TpuDoc.field_names())
        view = TpuDoc.from_doc(written, "n1")
        assert TpuDoc.fields(**{k: getattr(view, k) for k in written}) == \
            {k: tuple(v) if isinstance(v, list) else v for k, v in written.items()}
    fresh = TpuDoc.from_doc(_tpu_writes()[0], "n1")
    assert (fresh.id, fresh.state, fresh.idle_since, fresh.entry_id, fresh.quarantined) == \
        ("n1", TpuState.idle, NOW, "v4", False)


def test_a_tpu_view_keeps_a_state_it_does_not_know_and_ignores_unknown_fields():
    view = TpuDoc.from_doc({"state": "retired", "surprise": 1, "quarantined": None})
    assert (view.state, view.quarantined, view.id) == ("retired", False, "")


def test_every_field_written_to_an_execution_is_the_view_s_and_reads_back():
    assignment = Assignment(job_id="j1", attempt=1, attempt_id="j1-1", node=NODE, zone="us-central2-b",
                            endpoints=[], at=NOW)
    job = {"id": "j1", "state": "assigned", "attempt": 1, "attempt_id": "j1-1", "tpu": NODE}
    writes = [decide.start_record(assignment, NOW) | decide.start_lease(NOW + timedelta(minutes=5), "delivery"),
              decide.started_record(NOW), ExecutionDoc.fields(probed_at=NOW, unreachable_since=None),
              ExecutionEnd("succeeded", "exit 0", NOW).to_doc(), lifecycle.abandoned_record(job, "never", NOW)]
    for written in writes:
        assert set(written) <= ExecutionDoc.field_names(), sorted(set(written) - ExecutionDoc.field_names())
        view = ExecutionDoc.from_doc(written)
        assert ExecutionDoc.fields(**{k: getattr(view, k) for k in written}) == written
    assert type(writes[0]["state"]) is str  # the enum's value, as the executor stored it before the view


@pytest.mark.parametrize("view", [TpuDoc, ExecutionDoc])
def test_tpu_and_execution_writes_name_only_declared_fields(view):
    with pytest.raises(TypeError):
        view.fields(idle_for=None)
    with pytest.raises(AttributeError):
        view.field("idle_for")
