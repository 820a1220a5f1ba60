"""The executor logs in as the user the claimer installed: the stored fleet's `ssh_user`, and nothing else.

The claimer writes `<fleet.ssh_user>:ssh-ed25519 ...` into each node's `ssh-keys` metadata (`node_metadata`); the
TPU VM's guest agent creates that user and no other, and so do the fake's worker hosts (started here exactly as the
fake starts a node's hosts: from that metadata). Before, the executor logged in as `$TPUQ_SSH_USER` or `tpuq`,
whatever the fleet said, and a fleet with another `ssh_user` failed every attempt on authentication.
"""

from __future__ import annotations

import io
import random
from datetime import datetime, timezone

import paramiko
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts import topology
from tpuq.claimer.tpuapi import node_metadata
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import ENV_EXECUTOR_KEEP_SSH, ENV_SSH_PRIVATE_KEY_FILE, Settings
from tpuq.executor import handlers
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, SshLogin
from tpuq.executor.workerspec import WorkerSettings
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryFirestore, MemoryPublisher
from tpuq.contracts.messages import AttemptOutcome
from tpuq.runtime.service import Context
from tpuq_dev.faketpu.server import lenient_ssh_keys

from .conftest import SSH_USER, SshIdentity, _new_ed25519_pem, endpoints_of, wait_until
from .factories import T0, make_assignment

USER = "researcher"
FLEET = FleetFile.model_validate({"name": "lab", "project": "tpuq-local", "ssh_user": USER,
                                  "tpus": [{"id": "small", "type": "v4-8", "zones": ["us-central2-b"]}]})


@pytest.fixture(scope="module")
def ssh_identity_pem() -> str:
    return _new_ed25519_pem()


@pytest.fixture(scope="module")
def ssh_identity(ssh_identity_pem) -> SshIdentity:
    """The executor's key, also as the file the service loads (`TPUQ_SSH_PRIVATE_KEY_FILE`)."""
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(ssh_identity_pem))
    return SshIdentity(SSH_USER, key, f"{key.get_name()} {key.get_base64()} {SSH_USER}")


@pytest.fixture
def node_hosts(host_manager, ssh_identity, host_keys):
    """One worker host of a node the claimer created for FLEET: its users are its `ssh-keys` metadata's."""
    public_key = f"{ssh_identity.pkey.get_name()} {ssh_identity.pkey.get_base64()}"
    metadata = node_metadata(FLEET, public_key)["ssh-keys"]
    assert lenient_ssh_keys(metadata).keys() == {USER}
    hosts = host_manager.start_hosts(1, lenient_ssh_keys(metadata), label="login")
    host_keys.publish(hosts)
    yield hosts
    host_manager.stop_hosts(hosts)


def executor_logging_in_as(user: str, fake_gcs, ssh_identity, host_keys) -> Executor:
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": fake_gcs.base_url})
    return Executor(ssh_login=lambda: SshLogin(user), ssh_key=lambda: ssh_identity.pkey, pin_store=InMemoryPinStore(),
                    host_keys=host_keys, objects=GcsObjectStore(client), clock=lambda: T0,
                    settings=WorkerSettings.for_emulator(fake_gcs.base_url),
                    connect_policy=ConnectPolicy(attempts=1, connect_timeout=5), sleep=lambda s: None)


def test_a_user_other_than_the_metadata_s_is_refused(node_hosts, fake_gcs, ssh_identity, host_keys, bucket):
    a = make_assignment(endpoints=endpoints_of(node_hosts), bucket=bucket, command="touch /tmp/ran")
    for other in ("tpuq", ssh_identity.user):  # the old default; a user this machine has, with this very key
        result = executor_logging_in_as(other, fake_gcs, ssh_identity, host_keys).start_attempt(a)
        assert result.outcome is not None and result.outcome.outcome == AttemptOutcome.infra_failed
        assert "Authentication failed" in result.outcome.detail, result.outcome.detail
    assert not node_hosts[0].path_on_host("/tmp/ran").exists()


def test_a_fleet_with_its_own_ssh_user_runs_a_job_through_the_executor_service(
        node_hosts, fake_gcs, ssh_identity_pem, host_keys, bucket, tmp_path):
    key_file = tmp_path / "executor_key"  # what deploy mounts from Secret Manager; `tpuq dev up` writes locally
    key_file.write_text(ssh_identity_pem)
    # As the deployed service reads them: no fleet named, one stored.
    settings = Settings.from_env({ENV_SSH_PRIVATE_KEY_FILE: str(key_file), ENV_EXECUTOR_KEEP_SSH: "0",
                                  "STORAGE_EMULATOR_HOST": fake_gcs.base_url})
    publisher = MemoryPublisher(settings.topic_path(t.name) for t in topology.TOPICS)
    clients = Clients(settings, firestore=MemoryFirestore(project="tpuq-local"), publisher=publisher,
                      tpu=object())  # host keys come from `host_keys` below, as guest attributes would
    save_fleet(clients.firestore, FLEET, T0)
    service = handlers.build_service(settings, clients)
    executor = service.state.executor  # built as the service builds it
    executor.host_keys = host_keys
    now = datetime.now(timezone.utc)
    sub = next(s for s in topology.SUBSCRIPTIONS if s.name == "executor-assignments")
    ctx = Context(clients=clients, now=lambda: now, rng=random.Random(0), message_id="m1", attributes={},
                  publish_time=now, subscription=sub, service="executor", settings=settings, state=service.state)

    a = make_assignment(endpoints=endpoints_of(node_hosts), bucket=bucket, command="id -un > who.txt")
    handlers.on_assignment(a, ctx)
    [event] = [m for m in publisher.take(settings.topic_path("attempt-events"))]
    assert b'"started"' in event.data, event.data
    decided = wait_until(lambda: _if_decided(executor.read_outcome(a, NodeState.ready)), 30, "the job's end")
    assert decided.outcome == AttemptOutcome.succeeded, decided.detail
    assert node_hosts[0].path_on_host(f"/home/{USER}/tpuq/job/who.txt").read_text() == f"{USER}\n"


def _if_decided(decision):
    return decision if isinstance(decision, Decided) else None
