"""Shared fixtures for the fake Cloud TPU tests: an SSH key pair and a paramiko helper."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

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


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # a poll that raises is "not yet"
            last_error = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}" + (f": last error {last_error!r}" if last_error else ""))
