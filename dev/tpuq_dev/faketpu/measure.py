"""Measure how fast a big fake slice is usable: `python -m tpuq_dev.faketpu.measure [accelerator] [runs]`.

Prints, per run: seconds from the end of scenario provisioning to ACTIVE (the
hosts being started), and from ACTIVE as seen by a polling client to every
worker having answered a command over SSH (paramiko, 8 connections at a time).
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tpuq.contracts.tputypes import parse_accelerator_type

from .hosts import SSH_PORT
from tpuq_dev.capacitymodel.model import QrState
from .server import FakeTpuServer

USER = "tpuqfake"
ZONE = "us-central2-b"


def _key() -> tuple[str, paramiko.PKey]:
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    return f"{USER}:{public} {USER}", paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def _run(address: str, port: int, pkey: paramiko.PKey) -> None:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(address, port, username=USER, pkey=pkey, look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, _ = client.exec_command("echo ok")
        assert out.read() == b"ok\n"
    finally:
        client.close()


def measure(accelerator: str = "v5litepod-64", runs: int = 3) -> None:
    accel = parse_accelerator_type(accelerator)
    family = accel.family
    scenario = {
        "zones": {ZONE: {"quota": {family: {"spot": 100_000}}}},
        "delays": {"accepted": 0, "waiting": 0, "provisioning": 60, "deleting": 0},
    }
    metadata, pkey = _key()
    with tempfile.TemporaryDirectory() as state, FakeTpuServer(scenario, 600, state) as server:
        world = server.world
        for run in range(runs):
            qr_id = f"m{run}"
            body = {
                "tpu": {"nodeSpec": [{"nodeId": f"{qr_id}-n", "node": {
                    "acceleratorType": accelerator, "runtimeVersion": accel.default_runtime,
                    "metadata": {"ssh-keys": metadata}}}]},
                "spot": {},
            }
            world.create_queued_resource("measure", ZONE, qr_id, body, None)
            provisioned_at = time.monotonic() + server.clock.real_seconds(60)  # type: ignore[attr-defined]
            while world.get_queued_resource("measure", ZONE, qr_id).state != QrState.ACTIVE:
                time.sleep(0.005)
            active_at = time.monotonic()
            node = world.get_node("measure", ZONE, f"{qr_id}-n")
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda e: _run(e.ip_address, SSH_PORT, pkey), node.endpoints))
            reachable_at = time.monotonic()
            print(
                f"{accelerator} run {run}: {len(node.endpoints)} hosts; provisioning end -> ACTIVE "
                f"{active_at - provisioned_at:.2f}s; ACTIVE -> all reachable {reachable_at - active_at:.2f}s"
            )
            world.delete_queued_resource("measure", ZONE, qr_id, force=True)
            server.stop_unwanted_hosts()


if __name__ == "__main__":
    measure(sys.argv[1] if len(sys.argv) > 1 else "v5litepod-64", int(sys.argv[2]) if len(sys.argv) > 2 else 3)
