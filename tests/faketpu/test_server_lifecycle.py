"""Starting and stopping the fake: standalone and in-process, big slices, and nothing left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import yaml

from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq_dev.faketpu.hosts import SSH_PORT
from tpuq_dev.faketpu.server import FakeTpuServer

from .conftest import FAST_SCENARIO, FAST_TIME_SCALE, ZONE, qr_request, qr_state, ssh_run, tpu_client, wait_until


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _still_running(processes: dict[int, str]) -> list[int]:
    """pids of `processes` (pid -> start time) that are the same process and still alive: a reused pid is not."""
    return [pid for pid, started in processes.items() if _start_time(pid) == started]


def _active_slice(url: str, project: str, accelerator: str, ssh_key, qr_id: str = "q") -> tuple[str, list]:
    """Create a spot slice, wait for ACTIVE; returns (node name, endpoints)."""
    client = tpu_client(url)
    parent = f"projects/{project}/locations/{ZONE}"
    request = qr_request(project, ZONE, qr_id, f"{qr_id}-node", accelerator, ssh_metadata=ssh_key.metadata)
    client.create_queued_resource(request=request).result(timeout=10)
    wait_until(lambda: qr_state(client, f"{parent}/queuedResources/{qr_id}") == "ACTIVE", timeout=30, what="ACTIVE")
    node_name = f"{parent}/nodes/{qr_id}-node"
    return node_name, list(client.get_node(name=node_name).network_endpoints)


def _start_job_on_every_worker(endpoints, ssh_key) -> None:
    # A setsid'd job outlives the SSH session, like a real training job.
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda e: ssh_run(e.ip_address, SSH_PORT, ssh_key, "setsid sleep 600 >/dev/null 2>&1 </dev/null &"), endpoints))


def _long_lived_host_processes(control: FakeTpuControl, node_name: str) -> dict[int, str]:
    """pid -> start time of each host's unshare, its namespace init (sshd) and the setsid'd job.

    Only processes that live until the host is killed: an sshd session process that is exiting after its
    command would make the "alive before stop" check depend on timing."""

    def collect():
        hosts = control.node_info(node_name)["hosts"]
        found = {}
        for h in hosts:
            jobs = [p for p in h["pids"] if _comm(p) == "sleep"]
            if not jobs:
                return None  # the job is not visible yet
            for pid in (h["unshare_pid"], h["init_pid"], *jobs):
                started = _start_time(pid)
                if started is None:
                    return None
                found[pid] = started
        return found

    return wait_until(collect, what="host processes")


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_a_16_host_slice_is_reachable_on_every_worker(fast_server, ssh_key, project):
    node_name, endpoints = _active_slice(fast_server.url, project, "v5litepod-64", ssh_key)
    assert len(endpoints) == 16 and len({e.ip_address for e in endpoints}) == 16

    def reachable(endpoint) -> bool:
        wait_until(lambda: ssh_run(endpoint.ip_address, SSH_PORT, ssh_key, "echo ok") == "ok\n", timeout=30,
                   what=f"ssh to {endpoint.ip_address}")
        return True

    # Batches of 8, as gcloud and the executor do against MaxStartups 10:30:100.
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(reachable, endpoints))
    FakeTpuControl(fast_server.url).preempt(node_name)


def test_requests_turn_active_with_no_client_request(fast_server, project):
    from tpuq_dev.capacitymodel.model import QrState

    client, control = tpu_client(fast_server.url), FakeTpuControl(fast_server.url)
    client.create_queued_resource(request=qr_request(project, ZONE, "quiet", "quiet-node", "v4-8")).result(timeout=10)
    control.clear_calls()
    name = f"projects/{project}/locations/{ZONE}/queuedResources/quiet"
    # Read the world directly, without taking a step of the state machine ourselves.
    wait_until(lambda: fast_server.world.queued_resources[name].state == QrState.ACTIVE, what="ACTIVE by itself")
    assert [c for c in control.calls() if project in c["path"]] == []
    assert fast_server.hosts_of(f"projects/{project}/locations/{ZONE}/nodes/quiet-node")


def test_stop_leaves_no_sshd_or_worker_process(tmp_path, ssh_key, project):
    server = FakeTpuServer(FAST_SCENARIO, FAST_TIME_SCALE, tmp_path)
    url = server.start()
    try:
        node_name, endpoints = _active_slice(url, project, "v4-32", ssh_key)
        _start_job_on_every_worker(endpoints, ssh_key)
        processes = _long_lived_host_processes(FakeTpuControl(url), node_name)
        assert len(processes) == 4 * 3
    finally:
        server.stop()
    assert _still_running(processes) == []


def test_standalone_process_serves_and_cleans_up_on_sigterm(tmp_path, ssh_key, project):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(FAST_SCENARIO))
    url_file = tmp_path / "url"
    process = subprocess.Popen(
        [sys.executable, "-m", "tpuq_dev.faketpu", "--host", "127.0.0.1", "--port", "0", "--scenario", str(scenario),
         "--time-scale", str(FAST_TIME_SCALE), "--state-dir", str(tmp_path / "state"), "--url-file", str(url_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        printed = process.stdout.readline().strip()
        assert printed.startswith("http://127.0.0.1:") and url_file.read_text().strip() == printed
        assert FakeTpuControl(printed).health()["ok"]
        node_name, endpoints = _active_slice(printed, project, "v4-32", ssh_key)
        _start_job_on_every_worker(endpoints, ssh_key)
        processes = _long_lived_host_processes(FakeTpuControl(printed), node_name)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert _still_running(processes) == []


def test_invalid_scenario_exits_with_a_clear_message(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("zones:\n  us-central2-b:\n    quota:\n      v9: {spot: 1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "tpuq_dev.faketpu", "--scenario", str(scenario)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unknown accelerator family 'v9'" in result.stderr

