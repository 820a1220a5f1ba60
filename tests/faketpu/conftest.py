"""Shared fixtures for the fake Cloud TPU tests: SSH keys, paramiko, a Cloud TPU client, a fast server."""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.faketpu.server import FakeTpuServer
from tests.helpers import wait_until  # noqa: F401 - re-exported for this package's tests

TEST_USER = "tpuqfake"


@dataclass(frozen=True)
class SshKeyPair:
    user: str
    public_line: str  # "ssh-ed25519 AAAA... comment"
    private: paramiko.Ed25519Key

    @property
    def metadata(self) -> str:
        """The node's `ssh-keys` metadata value."""
        return f"{self.user}:{self.public_line}"


@pytest.fixture(scope="session")
def ssh_key() -> SshKeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    return SshKeyPair(TEST_USER, f"{public.decode()} {TEST_USER}", paramiko.Ed25519Key.from_private_key(io.StringIO(pem)))


def ssh_run(address: str, port: int, key: SshKeyPair, command: str, timeout: float = 10.0) -> str:
    """Connect, run one command, return its stdout. Raises on connection failure or non-zero exit."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(
            address, port, username=key.user, pkey=key.private, look_for_keys=False, allow_agent=False,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
        )
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode()
        status = stdout.channel.recv_exit_status()
        if status:
            raise RuntimeError(f"{command!r} exited {status}: {stderr.read().decode()}")
        return out
    finally:
        client.close()




# -- Cloud TPU client helpers ---------------------------------------------------------------

ZONE = "us-central2-b"  # v4/v5e/v6e quota, capacity
NO_QUOTA_ZONE = "europe-west4-a"  # in the scenario, no quota at all
STOCKOUT_ZONE = "us-east1-d"  # quota, but v4 is stocked out (fail)
WAIT_ZONE = "us-west1-c"  # quota, but every family waits for capacity forever
CONTROL_ZONE = "us-west4-a"  # quota; tests flip its capacity through the control API

FAST_SCENARIO = {
    "seed": 11,
    "zones": {
        ZONE: {"quota": {"v4": {"spot": 256, "on_demand": 64}, "v5litepod": {"spot": 128}, "v6e": {"spot": 64}}},
        NO_QUOTA_ZONE: {},
        STOCKOUT_ZONE: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"family": "v4", "start": 0}]},
        WAIT_ZONE: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"start": 0, "effect": "wait"}]},
        CONTROL_ZONE: {"quota": {"v4": {"spot": 64}}},
    },
    # deleting 0: delete operations finish within the call, so clients never wait out a poll interval.
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 600, "suspending": 30, "deleting": 0},
}
FAST_TIME_SCALE = 1200.0  # 10 scenario minutes of provisioning per half real second


def tpu_client(url: str) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=url)
    )


def qr_request(
    project: str,
    zone: str,
    qr_id: str,
    node_id: str,
    accelerator: str = "v4-32",
    *,
    tier: str = "spot",
    ssh_metadata: str | None = None,
    request_id: str | None = None,
    valid_until_seconds: int | None = None,
    external_ips: bool = True,
) -> tpu_v2.CreateQueuedResourceRequest:
    parent = f"projects/{project}/locations/{zone}"
    node = tpu_v2.Node(
        accelerator_type=accelerator,
        runtime_version="tpu-ubuntu2204-base",
        labels={"owner": "tpuq-tests"},
        metadata={"ssh-keys": ssh_metadata} if ssh_metadata else {},
        network_config=tpu_v2.NetworkConfig(enable_external_ips=external_ips),
    )
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=node_id, node=node)])
    )
    if tier == "spot":
        qr.spot = tpu_v2.QueuedResource.Spot()
    else:
        qr.guaranteed = tpu_v2.QueuedResource.Guaranteed()
    if valid_until_seconds is not None:
        qr.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration={"seconds": valid_until_seconds})
    return tpu_v2.CreateQueuedResourceRequest(
        parent=parent, queued_resource_id=qr_id, queued_resource=qr, request_id=request_id or ""
    )


def qr_state(client: tpu_v2.TpuClient, name: str) -> str:
    return client.get_queued_resource(name=name).state.state.name


def manual_clock_server(state_dir, **delays) -> tuple[FakeTpuServer, ManualClock]:
    """A server (not started) on a manual clock, so the test decides when each transition happens."""
    clock = ManualClock()
    scenario = {**FAST_SCENARIO, "delays": {**FAST_SCENARIO["delays"], **delays}}
    return FakeTpuServer(scenario, state_dir=state_dir, clock=clock), clock


@pytest.fixture(scope="session")
def fast_server(tmp_path_factory):
    with FakeTpuServer(FAST_SCENARIO, FAST_TIME_SCALE, tmp_path_factory.mktemp("faketpu-fast")) as server:
        yield server


@pytest.fixture
def project() -> str:
    """A fresh project per test: quota and billing are per project, so tests sharing a server stay independent."""
    return f"p-{uuid.uuid4().hex[:10]}"
