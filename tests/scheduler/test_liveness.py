"""Liveness (issue 31): a job requeued after a lost host is assigned, or asks the claimer for a TPU the claimer
will serve, or says what holds it. Never "pending" with nothing holding it.

The chaos soak found `chaos-17-0004` pending for ever after its host was lost. The cause, replayed here on the
in-memory store without chaos:
1. the job runs; its host dies; the attempt ends `infra_failed` and the job waits out its retry back-off;
2. a tick's pass, with no idle TPU in its snapshot, asks for capacity under the job's next request number; while
   it publishes, a slice turns ACTIVE (a race loser: no request of this job) and that event's pass assigns the
   job to it; the tick's record of the ask loses to that write, so the tick withdraws the request it published;
3. the job's next host dies too; after the back-off its next ask must not reuse the withdrawn number: the claimer
   never reopens a withdrawn request (a late copy must not revive it), so the job would hold a request nobody
   serves, with no assignment and no reason, for ever.
The claimer's side is its own pure rule (`tpuq.claimer.decide`), fed the capacity messages the scheduler published.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

from tpuq.contracts import topology
from tpuq.claimer.decide import decide_request_received
from tpuq.claimer.model import ClaimState, RequestReceived
from tpuq.contracts.documents import JobDoc
from tpuq.runtime.fleetstore import save_fleet
from tpuq.contracts.jobspec import PublishedJob
from tpuq.contracts.liveness import LIVENESS_BOUND, nothing_holds
from tpuq.contracts.messages import AttemptEvent, CapacityRequest, Tick
from tpuq.scheduler import handlers
from tpuq.runtime.service import Context

from tests.scheduler.conftest import active, fleet_file

HOST_DOWN = "worker 0 unreachable over SSH for 61 s (its host is down)"
BACKOFF = 10  # seconds: the fleet's retry back-off (base and cap), so a requeued job waits out a known time


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def context(sched, clock: Clock, path: str, message_id: str) -> Context:
    return Context(clients=sched.clients, now=clock, rng=random.Random(1), message_id=message_id, attributes={},
                   publish_time=None, subscription=topology.subscription_by_path("scheduler", path),
                   service="scheduler", settings=sched.clients.settings)


def attempt_event(kind: str, attempt: int, node: str, outcome: str | None = None) -> AttemptEvent:
    return AttemptEvent(kind=kind, job_id="j1", attempt=attempt, attempt_id=f"j1-{attempt}",
                        node=f"projects/tpuq-local/locations/us-central2-b/nodes/{node}", outcome=outcome,
                        detail=HOST_DOWN if outcome else None, at=datetime.now(timezone.utc))


def capacity_messages(sched) -> list[CapacityRequest]:
    return [CapacityRequest.model_validate(m) for m in sched.drain("capacity")]


def claimer_requests(messages: list[CapacityRequest], clock: Clock) -> dict:
    """The claimer's request records after these messages, by its own rule (a withdrawal is final)."""
    state = ClaimState(fleet=fleet_file())
    for message in messages:
        state = decide_request_received(state, RequestReceived(message), clock(), random.Random(1)).applied(state)
    return state.requests


def test_a_job_requeued_after_a_lost_host_never_asks_under_a_withdrawn_request(sched, monkeypatch):
    clock = Clock()
    save_fleet(sched.db, fleet_file(retry={"backoff_base_seconds": BACKOFF, "backoff_max_seconds": BACKOFF}),
               clock())
    published: list[CapacityRequest] = []

    def tick(seq: int) -> None:
        handlers.on_tick(Tick(seq=seq), context(sched, clock, "/push/ticks", f"tick-{seq}"))
        published.extend(capacity_messages(sched))

    def run_on(node: str, attempt: int, request_id: str | None) -> None:
        handlers.on_fleet_event(active(node, request_id=request_id),
                                context(sched, clock, "/push/fleet-events", f"active-{node}"))
        handlers.on_attempt_event(attempt_event("started", attempt, node),
                                  context(sched, clock, "/push/attempt-events", f"started-{attempt}"))
        assert sched.job("j1")["state"] == "running" and sched.job("j1")["attempt"] == attempt

    def host_lost(node: str, attempt: int) -> None:
        clock.advance(61)
        handlers.on_attempt_event(attempt_event("ended", attempt, node, "infra_failed"),
                                  context(sched, clock, "/push/attempt-events", f"ended-{attempt}"))
        job = sched.job("j1")
        assert job["state"] == "pending" and job["tpu"] is None and job["not_before"] > clock()

    handlers.on_job(PublishedJob.model_validate({"id": "j1", "tpu": "v4-8", "command": "train"}),
                    context(sched, clock, "/push/jobs", "submit-1"))
    published.extend(capacity_messages(sched))
    assert [m.request_id for m in published] == ["r-j1-1"]
    run_on("n1", 1, "r-j1-1")
    published.extend(capacity_messages(sched))
    host_lost("n1", 1)

    # The tick's pass asks under the next number; while it publishes, a race loser's slice turns ACTIVE and that
    # event's pass assigns the job first (the publisher is the port where the two handlings interleave).
    publisher = sched.clients.publisher
    real_publish = publisher.publish
    interleaved = []

    def publish(topic: str, data: bytes, **kwargs):
        result = real_publish(topic, data, **kwargs)
        message = json.loads(data)
        if topic.endswith("/capacity") and message.get("action") == "request" and not interleaved:
            interleaved.append(message["request_id"])
            run_on("n2", 2, request_id=None)
        return result

    monkeypatch.setattr(publisher, "publish", publish)
    clock.advance(BACKOFF + 1)
    tick(1)
    monkeypatch.setattr(publisher, "publish", real_publish)
    assert interleaved == ["r-j1-2"]
    withdrawn = {m.request_id for m in published if m.action.value == "withdraw"}
    assert "r-j1-2" in withdrawn  # the tick took back what it asked for: the job had its TPU

    host_lost("n2", 2)
    clock.advance(BACKOFF + 1)
    tick(2)
    tick(3)  # a redelivered tick changes nothing

    job = JobDoc.from_doc(sched.job("j1"))
    asked = job.capacity_request_id
    assert asked is not None and asked not in withdrawn, (asked, withdrawn)
    requests = claimer_requests(published, clock)
    assert requests[asked].open, "the claimer holds the job's request open: it will be served"
    # The rule itself, two bounds later with nothing else happening: kept.
    clock.advance(2 * LIVENESS_BOUND.total_seconds())
    open_ids = {r for r, record in requests.items() if record.open}
    assert nothing_holds(job, open_ids, clock()) is None
