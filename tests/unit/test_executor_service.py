"""The executor service as `build_service(settings, clients, executor=, probe=)` makes it (issue 33 §5): its state is
its own (no registry keyed by the clients' id), built from the Settings passed in (never from os.environ), and its
real Executor is built on first use. On the in-memory Firestore and publisher, delivered through the Service."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tpuq.contracts import store, topology
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import Tick
from tpuq.executor import decide, handlers
from tpuq.executor.decide import AssignmentStep
from tpuq.executor.executor import WorkerProbe
from tpuq.executor.outcome import DEFAULT_FAILURE_GRACE
from tpuq.executor.ssh import ConnectionCache
from tpuq.runtime.clients import Clients
from tpuq.runtime.fleetstore import save_fleet
from tpuq.runtime.service import PushMessage
from tpuq.runtime.settings import ENV_SSH_PRIVATE_KEY_FILE, Settings
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher

from tests.unit.test_executor_redelivery import ASSIGNMENT, NOW, FakeExecutor


class ProbedExecutor(FakeExecutor):
    """Counts the probes of its workers; every worker answers that the attempt runs."""

    def __init__(self):
        super().__init__()
        self.probes: list[str] = []

    def probe_attempt(self, attempt):
        self.probes.append(attempt.attempt_id)
        return {0: WorkerProbe(0, reachable=True, current=True, launched=True, supervisor_alive=True, job_alive=True)}


def memory_clients(settings: Settings) -> Clients:
    """In-memory Firestore and publisher; the TPU API and GCS clients are placeholders nothing here calls."""
    return Clients(settings, firestore=MemoryFirestore(project=settings.project),
                   publisher=MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS),
                   tpu=object(), storage=object())


def deliver(service, subscription: str, message, message_id: str = "m1") -> int:
    sub = next(s for s in topology.SUBSCRIPTIONS if s.name == subscription)
    push = PushMessage(message_id=message_id, data=message.model_dump_json(exclude_none=True).encode(),
                       attributes={}, publish_time=NOW, subscription=service.settings.subscription_path(sub.name))
    _, status = service.deliver(sub, push)
    return status


def started_events(clients: Clients) -> list[str]:
    taken = clients.publisher.take(clients.settings.topic_path("attempt-events"))
    return [json.loads(m.data)["attempt_id"] for m in taken]


def test_two_services_on_the_same_clients_keep_their_own_executor():
    """The old registry keyed the executor by id(clients): a second service on the same clients served with the
    first one's executor (or replaced it)."""
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner")
    clients = memory_clients(settings)
    first, second = FakeExecutor(), FakeExecutor()
    handlers.build_service(settings, clients, executor=first, probe=False)
    service = handlers.build_service(settings, clients, executor=second, probe=False)
    assert deliver(service, "executor-assignments", ASSIGNMENT) == 204
    assert second.starts == ["j1-1"] and first.starts == []
    assert started_events(clients) == ["j1-1"]


def _started_attempt(clients: Clients, started_ago: timedelta) -> None:
    ref = clients.firestore.collection(store.EXECUTIONS).document("j1:1")
    ref.set(decide.start_record(ASSIGNMENT, NOW - started_ago) | decide.started_record(NOW - started_ago))


@pytest.mark.parametrize("probe_seconds, probe, probed", [(30, True, True), (600, True, False), (30, False, False)])
def test_the_tick_probes_workers_at_the_settings_interval_unless_told_never(probe_seconds, probe, probed, monkeypatch):
    monkeypatch.setenv("TPUQ_EXECUTOR_PROBE_SECONDS", "1")  # the environment is not read: the Settings are
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner", executor_probe_seconds=probe_seconds)
    clients = memory_clients(settings)
    executor = ProbedExecutor()
    service = handlers.build_service(settings, clients, executor=executor, probe=probe)
    service.now = lambda: NOW
    _started_attempt(clients, timedelta(minutes=2))
    assert deliver(service, "executor-ticks", Tick(at=NOW)) == 204
    assert executor.probes == (["j1-1"] if probed else [])
    # Every worker answered: the probe changed nothing the record says, and writes nothing (its time is kept in
    # the instance's memory: tests/unit/test_executor_quiet_tick.py).
    record = clients.firestore.collection(store.EXECUTIONS).document("j1:1").get().to_dict()
    assert record.get("probed_at") is None and record.get("unreachable_since") is None
    assert (service.state.probed_at("j1:1") == NOW) is probed


def _write_key(path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    path.write_text(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()).decode())


def test_the_real_executor_is_built_on_first_use_from_the_settings_alone(tmp_path, monkeypatch):
    for name, value in (("TPUQ_SSH_PRIVATE_KEY_FILE", str(tmp_path / "absent")), ("TPUQ_EXECUTOR_KEEP_SSH", "1"),
                        ("TPUQ_FLEET", "absent"), ("TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS", "1")):
        monkeypatch.setenv(name, value)  # none of these is read: the Settings are
    key_file = tmp_path / "executor_key"
    _write_key(key_file)
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner", ssh_private_key_file=str(key_file),
                        executor_keep_ssh=False, fleet="lab", executor_failure_grace_seconds=7)
    clients = memory_clients(settings)
    for name, user in (("lab", "researcher"), ("other", "someone")):
        save_fleet(clients.firestore, FleetFile.model_validate(
            {"name": name, "project": "tpuq-local", "ssh_user": user,
             "tpus": [{"id": "small", "type": "v4-8", "zones": ["us-central2-b"]}]}), NOW)

    service = handlers.build_service(settings, clients)
    assert deliver(service, "executor-ticks", Tick(at=NOW)) == 204  # nothing to judge: nothing is built
    assert service.state.built is None
    executor = service.state.executor
    assert service.state.executor is executor, "built once"
    assert executor.connection_cache is None
    assert executor._ssh_key().get_name() == "ssh-ed25519"  # the key file the settings name
    assert executor.ssh_login().user == "researcher"  # the fleet the settings name, of the two stored
    assert service.state.probe_every == timedelta(seconds=settings.executor_probe_seconds)
    assert executor.failure_grace == timedelta(seconds=7)

    kept = handlers.build_service(Settings(project="tpuq-local", ssh_private_key_file=str(key_file)), clients)
    assert isinstance(kept.state.executor.connection_cache, ConnectionCache)
    assert kept.state.executor.failure_grace == DEFAULT_FAILURE_GRACE


def test_an_executor_without_its_key_names_the_setting_at_first_use_and_the_push_is_retried(monkeypatch, tmp_path):
    key_file = tmp_path / "executor_key"
    _write_key(key_file)
    monkeypatch.setenv("TPUQ_SSH_PRIVATE_KEY_FILE", str(key_file))  # not read: the Settings name no key
    settings = Settings(project="tpuq-local", runner_bucket="tpuq-runner")
    clients = memory_clients(settings)
    service = handlers.build_service(settings, clients)  # builds nothing yet
    with pytest.raises(RuntimeError, match=ENV_SSH_PRIVATE_KEY_FILE):
        service.state.executor  # noqa: B018 - the first use builds it
    assert deliver(service, "executor-assignments", ASSIGNMENT) == 500  # Pub/Sub delivers it again


def test_what_a_delivery_of_an_assignment_does_follows_the_attempts_record():
    assert decide.decide_assignment(None, NOW) is AssignmentStep.start
    starting = decide.start_record(ASSIGNMENT, NOW)
    assert decide.decide_assignment(starting, NOW) is AssignmentStep.start  # a record from before leases
    leased = starting | decide.start_lease(NOW + timedelta(minutes=8), "another")
    assert decide.decide_assignment(leased, NOW) is AssignmentStep.underway
    assert decide.decide_assignment(leased, NOW + timedelta(minutes=8)) is AssignmentStep.start
    assert decide.decide_assignment(starting | decide.started_record(NOW), NOW) is AssignmentStep.republish
    assert decide.decide_assignment({**leased, "ended": True}, NOW) is AssignmentStep.over


def test_connections_are_closed_only_to_nodes_no_longer_in_service():
    kept = {"projects/p/locations/z/nodes/a", "projects/p/locations/z/nodes/b"}
    assert decide.departed_nodes(kept, {"a"}) == {"projects/p/locations/z/nodes/b"}
    assert decide.departed_nodes(kept, {"a", "b"}) == set()

