"""`tpuq ssh`'s decisions (tpuq.operations.sshaccess): which firewall rule admits IAP, the exact gcloud and ssh argv,
which workers a job has, and which job states have a worker to open a shell on."""

from __future__ import annotations

import pytest

from tpuq.contracts.documents import JobDoc, JobState
from tpuq.operations.sshaccess import (
    IAP_RANGE,
    NodeView,
    SshRefused,
    check_worker,
    gcloud_argv,
    iap_firewall_command,
    iap_rules,
    local_ssh_argv,
    remote_command,
    running_node,
)

NODE = NodeView(name="projects/lab/locations/us-central2-b/nodes/tpuq-n1", network="default", tags=("tpuq-worker",),
                service_account="tpuq-worker@lab.iam.gserviceaccount.com", internal_ips=("10.0.0.2", "10.0.0.3"),
                external_ips=(None, None))
NET = "https://www.googleapis.com/compute/v1/projects/lab/global/networks/default"
SSH = [{"IPProtocol": "tcp", "ports": ["22"]}]


def rule(name="r", **fields):
    return {"name": name, "network": NET, "direction": "INGRESS", "priority": 1000, "sourceRanges": [IAP_RANGE],
            "allowed": SSH, **fields}


@pytest.mark.parametrize("rules, admitted", [
    ([rule()], ["r"]),
    ([rule(sourceRanges=["0.0.0.0/0"])], ["r"]),  # default-allow-ssh admits IAP too
    ([rule(sourceRanges=["35.235.240.0/24"])], []),  # a part of IAP's range: some tunnels fail
    ([rule(sourceRanges=["10.128.0.0/9"])], []),
    ([rule(allowed=[{"IPProtocol": "tcp", "ports": ["20-30"]}])], ["r"]),
    ([rule(allowed=[{"IPProtocol": "tcp"}])], ["r"]),
    ([rule(allowed=[{"IPProtocol": "all"}])], ["r"]),
    ([rule(allowed=[{"IPProtocol": "udp", "ports": ["22"]}])], []),
    ([rule(allowed=[{"IPProtocol": "tcp", "ports": ["443"]}])], []),
    ([rule(network=NET.replace("default", "other"))], []),
    ([rule(network="default")], ["r"]),  # a short name compares as the network's
    ([rule(disabled=True)], []),
    ([rule(direction="EGRESS")], []),
    ([rule(targetTags=["tpuq-worker"])], ["r"]),
    ([rule(targetTags=["web"])], []),
    ([rule(targetServiceAccounts=["tpuq-worker@lab.iam.gserviceaccount.com"])], ["r"]),
    ([rule(targetServiceAccounts=["other@lab.iam.gserviceaccount.com"])], []),
    ([rule(), rule("deny", denied=SSH, allowed=[], priority=900)], []),  # a higher-priority deny wins
    ([rule(), rule("deny", denied=SSH, allowed=[], priority=1000)], []),  # deny wins a tie
    ([rule(), rule("deny", denied=SSH, allowed=[], priority=2000)], ["r"]),
    ([rule(), rule("deny", denied=SSH, allowed=[], priority=900, sourceRanges=["1.2.3.0/24"])], ["r"]),
    ([rule("b"), rule("a", sourceRanges=["0.0.0.0/0"])], ["a", "b"]),
    ([], []),
])
def test_iap_rules(rules, admitted):
    assert iap_rules(rules, NODE) == admitted


def test_no_default_priority_needed():
    bare = {"name": "r", "network": NET, "sourceRanges": [IAP_RANGE], "allowed": SSH}  # priority, direction omitted
    assert iap_rules([bare], NODE) == ["r"]


def test_owner_command_names_network_range_port_and_the_nodes_tags():
    assert iap_firewall_command(NODE) == (
        "gcloud compute firewall-rules create default-allow-ssh-from-iap --project=lab --network=default "
        "--direction=INGRESS --action=ALLOW --rules=tcp:22 --source-ranges=35.235.240.0/20 --target-tags=tpuq-worker")


@pytest.mark.parametrize("iap, command, argv", [
    (False, None, ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpuq-n1", "--zone=us-central2-b", "--project=lab",
                   "--worker=1"]),
    (False, "hostname -f", ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpuq-n1", "--zone=us-central2-b",
                            "--project=lab", "--worker=1", "--command=hostname -f"]),
    (True, None, ["gcloud", "alpha", "compute", "tpus", "tpu-vm", "ssh", "tpuq-n1", "--zone=us-central2-b",
                  "--project=lab", "--worker=1", "--tunnel-through-iap"]),
])
def test_gcloud_argv(iap, command, argv):
    assert gcloud_argv(NODE, 1, command, iap=iap) == argv


def test_remote_command_joins_words_as_ssh_does():
    assert remote_command([]) is None
    assert remote_command(["echo", "a", "&&", "hostname"]) == "echo a && hostname"


def test_local_ssh_pins_the_host_key_and_uses_tpuqs_key():
    argv = local_ssh_argv("127.0.3.4", "tpuq", "/s/key", "/s/known", "exit 3")
    assert argv[0] == "ssh" and argv[-3:] == ["127.0.3.4", "--", "exit 3"]
    assert "StrictHostKeyChecking=yes" in argv and "UserKnownHostsFile=/s/known" in argv and "IdentitiesOnly=yes" in argv
    assert argv[argv.index("-i") + 1] == "/s/key" and argv[argv.index("-l") + 1] == "tpuq"
    assert local_ssh_argv("127.0.3.4", "tpuq", "/s/key", "/s/known", None)[-1] == "127.0.3.4"


@pytest.mark.parametrize("worker, count, message", [
    (7, 4, "--worker 7: job j has 4 workers, 0-3"),
    (1, 1, "--worker 1: job j has 1 worker, 0"),
    (0, 0, "job j: its TPU reports no workers yet"),
])
def test_check_worker_names_the_workers(worker, count, message):
    with pytest.raises(SshRefused) as e:
        check_worker("j", worker, count)
    assert str(e.value) == message


def test_check_worker_in_range():
    check_worker("j", 3, 4)


@pytest.mark.parametrize("state, says", [
    (JobState.pending, "job j is pending, not running: it has no TPU yet"),
    (JobState.assigned, "job j is assigned, not running: it is starting"),
    (JobState.succeeded, "job j is succeeded, not running: it has ended"),
    (JobState.cancelled, "job j is cancelled, not running: it has ended"),
])
def test_only_a_running_job_has_a_worker_to_open(state, says):
    with pytest.raises(SshRefused) as e:
        running_node(JobDoc(id="j", state=state, tpu="projects/p/locations/z-a/nodes/n"))
    assert str(e.value).startswith(says)


def test_running_node():
    job = JobDoc(id="j", state=JobState.running, tpu="projects/p/locations/us-central2-b/nodes/n", zone="us-central2-b")
    assert running_node(job) == ("projects/p/locations/us-central2-b/nodes/n", "us-central2-b")


def test_node_view_from_rest_json():
    node = NodeView.from_api({
        "name": "projects/p/locations/us-central2-b/nodes/n", "networkConfig": {"network": "vpc1"},
        "tags": ["t"], "serviceAccount": {"email": "a@p.iam.gserviceaccount.com"},
        "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470, "accessConfig": {"externalIp": "34.1.1.1"}},
                             {"ipAddress": "10.0.0.3", "port": 8470}]})
    assert (node.project, node.zone, node.short, node.network) == ("p", "us-central2-b", "n", "vpc1")
    assert node.internal_ips == ("10.0.0.2", "10.0.0.3") and node.external_ips == ("34.1.1.1", None)
