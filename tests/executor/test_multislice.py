"""A multislice attempt on the executor (issue 37): one flat list of workers over every slice, numbered
g = slice * hosts + w (tpuq.contracts.workers), each worker's environment saying its slice, its id within it, the
coordinator and the slice count. The plan on its own, then the real thing on sshd worker hosts and a fake GCS."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts import gcslayout
from tpuq.contracts.errors import Permanent
from tpuq.contracts.jobspec import MULTISLICE_ENV, RUNNER_ENV, JobSpec
from tpuq.contracts.messages import AssignedSlice, AttemptOutcome, WorkerEndpoint
from tpuq.contracts.workers import global_worker_id, split_worker_id, worker_label
from tpuq.executor.executor import AttemptRef, Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, SshLogin
from tpuq.executor.workerspec import MEGASCALE_ENV, MEGASCALE_PORT, AttemptPlan, WorkerSettings

from .conftest import wait_until
from .factories import T0, make_assignment

NODES = [f"projects/p/locations/us-central2-b/nodes/ms-{s}" for s in range(2)]
SETTINGS = WorkerSettings()


def _endpoints(slice_id: int, hosts: int) -> list[WorkerEndpoint]:
    return [WorkerEndpoint(worker_id=w, ip=f"10.0.{slice_id}.{w + 2}") for w in range(hosts)]


def multislice(slices: list[list[WorkerEndpoint]], nodes=NODES, wanted: int | None = None, **kw):
    """An assignment of len(slices) slices: slice 0 is also `node`/`endpoints`, as the scheduler sends it."""
    a = make_assignment(endpoints=slices[0], **kw)
    return a.model_copy(update={
        "node": nodes[0],
        "slices": [AssignedSlice(node=nodes[s], endpoints=e) for s, e in enumerate(slices)],
        "slices_wanted": wanted if wanted is not None else len(slices)})


def _env(plan: AttemptPlan, g: int) -> dict[str, str]:
    return plan.worker_spec(g, "/home/u", SETTINGS)["env"]


def test_two_slices_of_four_hosts_are_eight_workers_each_knowing_its_slice():
    nodes = NODES + ["projects/p/locations/us-central2-b/nodes/ms-extra"]
    plan = AttemptPlan.from_assignment(multislice([_endpoints(0, 4), _endpoints(1, 4)], nodes=nodes, wanted=4))
    assert plan.worker_count == 8 and [e.worker_id for e in plan.endpoints] == list(range(8))
    assert plan.slots == {g: (NODES[g // 4], g % 4) for g in range(8)}
    for g in range(8):
        s, w = divmod(g, 4)
        spec = plan.worker_spec(g, "/home/u", SETTINGS)
        env = spec["env"]
        assert (spec["worker_id"], spec["worker_count"]) == (g, 8)
        assert spec["gcs"]["status_object"] == f"tpuq/status/job-1/1/worker-{g}.json"
        assert env["TPU_WORKER_ID"] == str(w) and env["TPU_WORKER_COUNT"] == "4"
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(f"10.0.{s}.{i + 2}" for i in range(4))
        assert env["TPU_WORKER_HOST"] == f"10.0.{s}.{w + 2}"
        assert {k: env[k] for k in MEGASCALE_ENV} == {
            "MEGASCALE_COORDINATOR_ADDRESS": f"10.0.0.2:{MEGASCALE_PORT}",  # worker 0 of slice 0
            "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": str(s), "MEGASCALE_PORT": str(MEGASCALE_PORT)}
        assert {k: env[k] for k in MULTISLICE_ENV} == {
            "TPUQ_SLICE_ID": str(s), "TPUQ_SLICE_COUNT": "2", "TPUQ_SLICES_WANTED": "4",  # elastic: got 2 of 4
            "TPUQ_WORKER_GLOBAL_ID": str(g)}
    assert AttemptRef.from_assignment(multislice([_endpoints(0, 4), _endpoints(1, 4)])).worker_count == 8


def test_a_single_slice_assignment_keeps_todays_environment():
    a = make_assignment(hosts=4)
    plan = AttemptPlan.from_assignment(a)
    assert (plan.slots, plan.slice_count, plan.worker_count) == (None, 1, 4)
    env = _env(plan, 3)
    assert set(env) == RUNNER_ENV | {"TPUQ_ATTEMPT", "TPUQ_PREEMPTIONS"}
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("3", "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5")
    # The same node listed as the only slice, with no wish for more: still nothing new.
    one = a.model_copy(update={"slices": [AssignedSlice(node=a.node, endpoints=a.endpoints)]})
    assert _env(AttemptPlan.from_assignment(one), 3) == env


def test_an_elastic_job_that_got_one_slice_says_so_without_megascale():
    a = make_assignment(hosts=2).model_copy(update={"slices_wanted": 2})
    env = _env(AttemptPlan.from_assignment(a), 1)
    assert not set(env) & MEGASCALE_ENV
    assert {k: env[k] for k in MULTISLICE_ENV} == {"TPUQ_SLICE_ID": "0", "TPUQ_SLICE_COUNT": "1",
                                                   "TPUQ_SLICES_WANTED": "2", "TPUQ_WORKER_GLOBAL_ID": "1"}


def test_inconsistent_slices_are_permanent():
    with pytest.raises(Permanent, match="slice 1 .* has 2 workers and slice 0 has 4") as err:
        AttemptPlan.from_assignment(multislice([_endpoints(0, 4), _endpoints(1, 2)]))
    assert err.value.field == "slices[1].endpoints"
    with pytest.raises(Permanent, match="slice 0 must be the assignment's node"):
        AttemptPlan.from_assignment(multislice([_endpoints(0, 2), _endpoints(1, 2)]).model_copy(
            update={"endpoints": _endpoints(1, 2)}))
    with pytest.raises(Permanent, match="listed twice"):
        AttemptPlan.from_assignment(multislice([_endpoints(0, 2), _endpoints(1, 2)], nodes=[NODES[0], NODES[0]]))
    gap = _endpoints(1, 3)[1:]
    with pytest.raises(Permanent, match="0..N-1"):
        AttemptPlan.from_assignment(multislice([_endpoints(0, 2), gap]))


@pytest.mark.parametrize("where", ["env", "sweep"])
def test_a_job_may_not_set_megascale_variables(where):
    job = {"id": "j", "tpu": "v4-32", "command": "true", "buckets": ["gs://jobs-bucket"]}
    job |= {"env": {"MEGASCALE_NUM_SLICES": "2"}} if where == "env" else {"sweep": {"MEGASCALE_SLICE_ID": ["0", "1"]}}
    with pytest.raises(ValueError, match=f"(?s){where}.*'MEGASCALE_.*' is reserved: tpuq sets"):
        JobSpec.model_validate(job)
    from tpuq.executor.workerspec import build_worker_env

    with pytest.raises(Permanent) as err:
        build_worker_env({"MEGASCALE_PORT": "1"}, AttemptPlan.from_assignment(make_assignment()).runner_env(0, "/j"))
    assert err.value.field == "job.env.MEGASCALE_PORT"


def test_worker_numbering_and_labels():
    assert [global_worker_id(s, w, 4) for s in range(2) for w in range(4)] == list(range(8))
    assert split_worker_id(6, 4) == (1, 2)
    assert [worker_label(5), worker_label(5, 4, 1), worker_label(5, 4, 2), worker_label(5, None, 2)] == [
        "w5", "w5", "s1/w1", "w5"]
    with pytest.raises(ValueError):
        global_worker_id(0, 4, 4)


# -- on sshd worker hosts -------------------------------------------------------------------------------------


class HostKeysByNode:
    """A HostKeySource over several nodes: each slice's guest agents publish their own keys."""

    def __init__(self):
        self.by_node: dict[str, dict[int, str]] = {}

    def published(self, node: str) -> dict[int, str]:
        return dict(self.by_node.get(node, {}))


@pytest.fixture
def two_slices(start_hosts):
    from tpuq_dev.faketpu.hosts import published_host_keys

    keys = HostKeysByNode()
    slices = []
    for s, node in enumerate(NODES):
        hosts, endpoints = start_hosts(2, label=f"ms{s}")
        keys.by_node[node] = published_host_keys(hosts)
        slices.append((hosts, endpoints))
    return keys, slices


def test_a_two_slice_attempt_runs_on_every_worker_of_every_slice(fake_gcs, bucket, ssh_identity, two_slices, ticks):
    keys, slices = two_slices
    executor = _executor(fake_gcs, ssh_identity, keys, ticks)
    shown = " ".join(f"{k}=${k}" for k in ("TPU_WORKER_ID", "TPU_WORKER_COUNT", "TPU_WORKER_HOSTNAMES",
                                           *sorted(MULTISLICE_ENV), *sorted(MEGASCALE_ENV)))
    a = multislice([endpoints for _, endpoints in slices], bucket=bucket,
                   command=f'echo "{shown}"; while [ ! -e /tmp/go ]; do sleep 0.05; done')

    result = executor.start_attempt(a)
    assert (result.started, result.outcome) == (True, None), result.outcome
    probes = executor.probe_attempt(a)
    assert sorted(probes) == [0, 1, 2, 3] and all(p.job_alive and not p.lost for p in probes.values())
    for hosts, _ in slices:
        for host in hosts:
            host.path_on_host("/tmp/go").touch()
    decision = wait_until(lambda: _if_decided(executor.read_outcome(a, node_state=NodeState.ready)), 30, "an outcome")
    assert decision.outcome == AttemptOutcome.succeeded
    assert decision.exit_codes == {"0": 0, "1": 0, "2": 0, "3": 0}
    coordinator = slices[0][1][0].ip
    for g in range(4):
        s, w = divmod(g, 2)
        hosts = ",".join(e.ip for e in slices[s][1])
        log = fake_gcs.log_text(bucket, gcslayout.worker_log_prefix(a.job_id, a.attempt, g))
        assert log == (f"TPU_WORKER_ID={w} TPU_WORKER_COUNT=2 TPU_WORKER_HOSTNAMES={hosts} TPUQ_SLICES_WANTED=2 "
                       f"TPUQ_SLICE_COUNT=2 TPUQ_SLICE_ID={s} TPUQ_WORKER_GLOBAL_ID={g} "
                       f"MEGASCALE_COORDINATOR_ADDRESS={coordinator}:{MEGASCALE_PORT} MEGASCALE_NUM_SLICES=2 "
                       f"MEGASCALE_PORT={MEGASCALE_PORT} MEGASCALE_SLICE_ID={s}\n"), g
    # Host keys were pinned per node, by the node's own worker ids.
    assert [sorted(executor.pin_store.get_pins(n)) for n in NODES] == [[0, 1], [0, 1]]


def test_cancelling_a_two_slice_attempt_stops_every_worker(fake_gcs, bucket, ssh_identity, two_slices, ticks):
    keys, slices = two_slices
    executor = _executor(fake_gcs, ssh_identity, keys, ticks)
    a = multislice([endpoints for _, endpoints in slices], bucket=bucket, command="sleep 300")
    assert executor.start_attempt(a).started
    assert executor.cancel_attempt(a, reason="test").detail == "test"  # every worker of both slices reached
    wait_until(lambda: not any(p.job_alive for p in executor.probe_attempt(a).values()), 30, "every job stopped")
    decision = wait_until(lambda: _if_decided(executor.read_outcome(a)), 30, "an outcome")
    assert decision.outcome == AttemptOutcome.cancelled


def _executor(fake_gcs, ssh_identity, keys, ticks) -> Executor:
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": fake_gcs.base_url})
    return Executor(
        ssh_login=lambda: SshLogin(ssh_identity.user), ssh_key=lambda: ssh_identity.pkey,
        pin_store=InMemoryPinStore(), host_keys=keys, objects=GcsObjectStore(client), clock=lambda: T0,
        settings=WorkerSettings.for_emulator(fake_gcs.base_url, log_flush_seconds=0.2, cancel_grace_seconds=1.0,
                                             stale_grace_seconds=1.0),
        connect_policy=ConnectPolicy(attempts=2, connect_timeout=5, host_key_wait_seconds=10),
        sleep=ticks.sleep, monotonic=ticks.monotonic)


def _if_decided(decision):
    return decision if isinstance(decision, Decided) else None



def test_a_preempted_lost_or_unhealthy_slice_is_the_whole_attempts():
    from tpuq.contracts.documents import NodeHealth
    from tpuq.executor.decide import slices_state

    ready, sick = {"state": "busy"}, {"state": "busy", "node_health": NodeHealth.from_api(
        {"health": "UNHEALTHY_MAINTENANCE"}).to_doc()}
    preempted, gone = {"state": "gone", "gone_reason": "SUSPENDED"}, {"state": "gone", "gone_reason": "GONE"}
    assert slices_state([ready], NODES[:1]) == (NodeState.ready, None)
    assert slices_state([ready, ready], NODES) == (NodeState.ready, None)
    assert slices_state([ready, preempted], NODES)[0] is NodeState.preempted
    assert slices_state([gone, ready], NODES)[0] is NodeState.gone
    assert slices_state([ready, None], NODES)[0] is NodeState.unknown  # not evidence of anything
    state, problem = slices_state([ready, sick], NODES)
    assert state is NodeState.ready and problem.startswith("slice 1 (ms-1): UNHEALTHY_MAINTENANCE"), problem
