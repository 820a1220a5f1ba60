"""A fake worker host looks like a TPU VM from inside: its own processes in `ps`, TPU device files a process can
hold and another can see held, and a metadata server at metadata.google.internal that wants Metadata-Flavor."""

from __future__ import annotations

import pytest

from tpuq_dev.faketpu.hosts import WorkerHostManager, parse_ssh_keys_metadata
from tpuq_dev.faketpu.metadata import InstanceMetadata, answer

from .conftest import ssh_run, wait_until

PREEMPTED = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
MAINTENANCE = "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"


@pytest.fixture
def hosts(tmp_path, ssh_key):
    manager = WorkerHostManager(tmp_path / "hosts")
    metadata = [InstanceMetadata(project_id="p1", attributes={"agent-worker-number": str(i),
                                                              "accelerator-type": "v4-16"}) for i in range(2)]
    started = manager.start_hosts(2, parse_ssh_keys_metadata(ssh_key.metadata), label="machine", devices=4,
                                  metadata=metadata)
    yield started
    manager.stop_all()


def test_a_host_lists_only_its_own_processes(hosts, ssh_key):
    h0, h1 = hosts
    ssh_run(h1.address, h1.port, ssh_key, "setsid sleep 1001 >/dev/null 2>&1 </dev/null &")
    wait_until(lambda: "sleep 1001" in ssh_run(h1.address, h1.port, ssh_key, "ps -eo args"), what="sleep on worker 1")
    on_0 = ssh_run(h0.address, h0.port, ssh_key, "ps -eo pid,args")
    assert "sleep 1001" not in on_0
    # pid 1 is the host's sshd, not the machine's init.
    assert any(line.split(None, 1) == ["1", line.split(None, 1)[1]] and "sshd" in line
               for line in on_0.splitlines()[1:])


def test_a_process_holding_a_tpu_device_is_seen_through_proc(hosts, ssh_key):
    h0, h1 = hosts
    assert ssh_run(h0.address, h0.port, ssh_key, "ls /dev/accel* /dev/vfio/").split() == [
        "/dev/accel0", "/dev/accel1", "/dev/accel2", "/dev/accel3", "/dev/vfio/:", "0", "1", "2", "3", "vfio"]
    ssh_run(h0.address, h0.port, ssh_key, "setsid sh -c 'exec sleep 1002 3</dev/vfio/0' >/dev/null 2>&1 </dev/null &")
    holders = "for f in /proc/[0-9]*/fd/*; do l=$(readlink $f); case $l in /dev/vfio/*|/dev/accel*) echo $l;; esac; done"
    assert wait_until(lambda: ssh_run(h0.address, h0.port, ssh_key, holders), what="holder") == "/dev/vfio/0\n"
    assert ssh_run(h1.address, h1.port, ssh_key, holders) == ""  # worker 1's device is free


def test_metadata_server_answers_at_metadata_google_internal_with_the_flavor_header_only(hosts, ssh_key):
    h0, h1 = hosts
    curl = "curl -s -o /dev/null -w '%{http_code}' "
    assert ssh_run(h0.address, h0.port, ssh_key, curl + PREEMPTED) == "403"
    get = "curl -sf -H 'Metadata-Flavor: Google' "
    assert ssh_run(h0.address, h0.port, ssh_key, get + PREEMPTED) == "FALSE"
    assert ssh_run(h0.address, h0.port, ssh_key, get + MAINTENANCE) == "NONE"
    worker = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number"
    assert ssh_run(h1.address, h1.port, ssh_key, get + worker) == "1"
    h1.metadata.give_preemption_notice()
    assert ssh_run(h1.address, h1.port, ssh_key, get + PREEMPTED) == "TRUE"
    assert ssh_run(h1.address, h1.port, ssh_key, get + MAINTENANCE) == "TERMINATE_ON_HOST_MAINTENANCE"
    assert ssh_run(h0.address, h0.port, ssh_key, get + PREEMPTED) == "FALSE"  # per host


def test_metadata_answers_as_compute_engine_does():
    m = InstanceMetadata(project_id="p1", attributes={"ssh-keys": "alice:ssh-ed25519 AAAA"})
    flavor = {"Metadata-Flavor": "Google"}
    base = "/computeMetadata/v1/"
    assert answer(m, "GET", base + "instance/preempted", {})[0] == 403
    assert answer(m, "GET", base + "instance/preempted", {**flavor, "X-Forwarded-For": "1.2.3.4"})[0] == 403
    assert answer(m, "GET", base + "instance/preempted", {"metadata-flavor": "Google"}) == (200, "FALSE")
    assert answer(m, "GET", base + "instance/attributes/", flavor) == (200, "ssh-keys\n")
    assert answer(m, "GET", base + "project/project-id", flavor) == (200, "p1")
    assert answer(m, "GET", base + "instance/service-accounts/default/token", flavor)[0] == 404
    assert answer(m, "GET", base + "instance/preempted?wait_for_change=true", flavor)[0] == 400
