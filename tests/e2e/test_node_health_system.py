"""Node health on the whole local stack (issue 17 §4): the claimer polls each ACTIVE node's health and upcoming
maintenance on its tick, the pass gives no new job to a node whose maintenance comes soon, and a node that turns
unhealthy under a running job ends that attempt as an infrastructure failure, retried on another TPU in its region.

One walk on the session stack (the demo fleet: two v4-8 slices at most, all in us-central2, 60x scenario time)."""

from __future__ import annotations

import uuid

from tpuq.contracts import store
from tpuq.contracts.documents import NodeHealth, TpuHealth, TpuState, short_node_name
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.faketpu.control import FakeTpuControl

# Past the 5-minute backstop for lost events (TPUQ_BACKSTOP_SECONDS): a step once waited 4.5 minutes for it (a
# quarantined slice's GONE handled after the janitor's own record ran no pass: fixed, with a unit test in
# tests/scheduler/test_dirty_slice.py); a pass missed again must cost time here, not the outcome.
DEADLINE = 420
LONG = "i=0; while [ $i -lt 1200 ]; do i=$((i+1)); sleep 0.5; done"


def doc(clients, collection: str, doc_id: str) -> dict:
    return clients.firestore.collection(collection).document(doc_id).get().to_dict() or {}


def attempts(clients, job_id: str) -> dict[int, dict]:
    snaps = clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS).stream()
    return {int(s.id): s.to_dict() for s in snaps}


def until_state(clients, job_id: str, *states: str) -> dict:
    return wait_for(lambda: (j := doc(clients, store.JOBS, job_id)).get("state") in states and j, timeout=DEADLINE,
                    what=f"{job_id} in {states}")


def health_of(clients, node: str) -> NodeHealth | None:
    return NodeHealth.from_doc(doc(clients, store.TPUS, short_node_name(node)))


def test_maintenance_keeps_new_jobs_off_and_an_unhealthy_node_loses_its_job_like_a_lost_host(system, system_clients):
    clients = system_clients
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    tag = uuid.uuid4().hex[:6]
    a, b, c = f"health-a-{tag}", f"health-b-{tag}", f"health-c-{tag}"
    for job_id in (a, b):
        clients.publish("jobs", {"id": job_id, "tpu": "v4-8", "command": LONG})
    tpu_a, tpu_b = until_state(clients, a, "running")["tpu"], until_state(clients, b, "running")["tpu"]
    assert tpu_a != tpu_b

    # (1) B's node gets a maintenance notice: its window opens in 6 scenario hours (6 real minutes at 60x), inside
    # the 24 h horizon. The claimer's tick reads it and the scheduler records it.
    control.schedule_maintenance(tpu_b, 6 * 3600, duration=3600)
    wait_for(lambda: (h := health_of(clients, tpu_b)) is not None and h.upcoming_maintenance is not None,
             timeout=DEADLINE, what="the maintenance notice in tpus/{node}.node_health")
    # C waits (both v4-8 slices busy; a spare one an earlier test or a race's loser left goes at its idle timeout
    # first); its first attempt runs until stopped, a second one ends at once.
    wait_for(lambda: not any(t.get("type") == "v4-8" and t.get("state") == TpuState.idle
                             for t in (d.to_dict() for d in clients.firestore.collection(store.TPUS).stream())),
             timeout=DEADLINE, what="no spare v4-8 slice")
    clients.publish("jobs", {"id": c, "tpu": "v4-8",
                             "command": f'if [ "$ATTEMPT_ID" = "{c}-1" ]; then {LONG}; fi; echo second attempt'})
    clients.publish("cancels", {"job_id": b})
    until_state(clients, b, "cancelled")
    wait_for(lambda: doc(clients, store.TPUS, short_node_name(tpu_b)).get("state") in ("idle", "deleting", "gone"),
             timeout=DEADLINE, what="B's TPU freed")
    clients.publish("cancels", {"job_id": a})  # A's healthy TPU frees: C goes there, not to B's
    first = until_state(clients, c, "running", "succeeded", "failed")
    tpu_c = first["tpu"]
    assert tpu_c != tpu_b, "a node due for maintenance took a new job"
    assert first["state"] == "running" and attempts(clients, c)[1]["tpu"] == tpu_c
    # The health poll is an exact GET of the node, on the fake's call log.
    assert any(call["path"] == f"/v2/{tpu_b}" and call["status"] == 200 for call in control.calls(method="GET"))

    # (2) C's node turns unhealthy while C runs: the attempt ends as an infrastructure failure (not a preemption),
    # the TPU is quarantined, and C runs again on another TPU in the same region.
    control.set_health(tpu_c, TpuHealth.UNHEALTHY_TENSORFLOW.value, symptom="HBM_OUT_OF_MEMORY", worker=0)
    wait_for(lambda: attempts(clients, c).get(1, {}).get("outcome") == "infra_failed", timeout=DEADLINE,
             what="C's first attempt ended as an infrastructure failure")
    done = until_state(clients, c, "succeeded", "failed")
    assert done["state"] == "succeeded", done.get("reason")
    assert done["infra_failures"] == 1 and not done.get("preemptions")
    history = attempts(clients, c)
    assert sorted(history) == [1, 2]
    assert history[1]["detail"].startswith("node unhealthy: UNHEALTHY_TENSORFLOW (HBM_OUT_OF_MEMORY on worker 0)")
    assert history[2]["tpu"] not in (tpu_c, tpu_b)
    assert history[2]["region"] == history[1]["region"] == done["pinned_region"]
    sick = doc(clients, store.TPUS, short_node_name(tpu_c))
    assert sick.get("quarantined") and NodeHealth.from_doc(sick).health is TpuHealth.UNHEALTHY_TENSORFLOW
    # The janitor deletes the quarantined TPU at once: its queued resource's DELETE is on the call log.
    qr = sick["queued_resource"]
    wait_for(lambda: any(call["path"] == f"/v2/{qr}" for call in control.calls(method="DELETE")), timeout=DEADLINE,
             what="the unhealthy TPU's queued resource deleted")
