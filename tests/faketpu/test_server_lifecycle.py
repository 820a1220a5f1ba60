"""Starting and stopping the fake: standalone and in-process, big slices, and nothing left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import yaml

from tpuq.faketpu.control import FakeTpuControl
from tpuq.faketpu.server import FakeTpuServer

from .conftest import FAST_SCENARIO, FAST_TIME_SCALE, ZONE, qr_request, qr_state, ssh_run, tpu_client, wait_until


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


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
        list(pool.map(lambda e: ssh_run(e.ip_address, e.port, ssh_key, "setsid sleep 600 >/dev/null 2>&1 </dev/null &"), endpoints))


def _all_host_pids(control: FakeTpuControl, node_name: str, expected_per_host: int) -> list[int]:
    def collect():
        hosts = control.node_info(node_name)["hosts"]
        if not all(len(h["pids"]) >= expected_per_host for h in hosts):
            return None
        return [p for h in hosts for p in (h["unshare_pid"], *h["pids"])]

    return wait_until(collect, what="host processes")


def test_a_16_host_slice_is_reachable_on_every_worker(fast_server, ssh_key, project):
    node_name, endpoints = _active_slice(fast_server.url, project, "v5litepod-64", ssh_key)
    assert len(endpoints) == 16 and len({e.ip_address for e in endpoints}) == 16

    def reachable(endpoint) -> bool:
        wait_until(lambda: ssh_run(endpoint.ip_address, endpoint.port, ssh_key, "echo ok") == "ok\n", timeout=30,
                   what=f"ssh to {endpoint.ip_address}")
        return True

    # Batches of 8, as gcloud and the executor do against MaxStartups 10:30:100.
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(reachable, endpoints))
    FakeTpuControl(fast_server.url).preempt(node_name)


def test_requests_turn_active_with_no_client_request(fast_server, project):
    from tpuq.faketpu.model import QrState

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
        pids = _all_host_pids(FakeTpuControl(url), node_name, expected_per_host=2)
        assert len(pids) >= 4 * 3 and all(_alive(p) for p in pids)
    finally:
        server.stop()
    assert [p for p in pids if _alive(p)] == []


def test_standalone_process_serves_and_cleans_up_on_sigterm(tmp_path, ssh_key, project):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(FAST_SCENARIO))
    url_file = tmp_path / "url"
    process = subprocess.Popen(
        [sys.executable, "-m", "tpuq.faketpu", "--host", "127.0.0.1", "--port", "0", "--scenario", str(scenario),
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
        pids = _all_host_pids(FakeTpuControl(printed), node_name, expected_per_host=2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [p for p in pids if _alive(p)] == []


def test_invalid_scenario_exits_with_a_clear_message(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("zones:\n  us-central2-b:\n    quota:\n      v9: {spot: 1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "tpuq.faketpu", "--scenario", str(scenario)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unknown accelerator family 'v9'" in result.stderr

