"""`tpuq ssh` on a multislice job (issue 37): `--slice S --worker W` is worker W of the gang's slice S, `--worker G`
alone the worker's id across the slices (as `tpuq logs --worker`), and out-of-range values are one line naming the
option. The CLI's choice of node (tpuq.cli.ssh._pick_worker) with the TPU API read replaced by the nodes below."""

from __future__ import annotations

import pytest

from tpuq.cli import ssh as cli_ssh
from tpuq.contracts.documents import JobDoc, JobState
from tpuq.operations.sshaccess import NodeView, SshRefused, global_worker, job_slices, slice_node

GANG = tuple(f"projects/lab/locations/us-central2-b/nodes/tpuq-ms-{i}" for i in range(2))
NODES = {name: NodeView(name=name, network="default", internal_ips=tuple(f"10.0.{i}.{w}" for w in range(4)),
                        external_ips=(None,) * 4) for i, name in enumerate(GANG)}


def job(gang=GANG) -> JobDoc:
    return JobDoc(id="ms", state=JobState.running, tpu=gang[0], gang=tuple(gang), zone="us-central2-b")


@pytest.fixture
def read_nodes(monkeypatch):
    read: list[str] = []

    def fake_read(clients, name):
        read.append(name)
        return NODES[name]

    monkeypatch.setattr(cli_ssh, "_read_node", fake_read)
    return read


def test_the_slices_of_a_job():
    assert job_slices(job()) == GANG
    assert job_slices(job(gang=(GANG[0],))) == (GANG[0],)
    assert job_slices(JobDoc(id="j", state=JobState.running, tpu=GANG[0])) == (GANG[0],)  # one slice: no gang


@pytest.mark.parametrize("worker, hosts, slices, expected", [(0, 4, 2, (0, 0)), (3, 4, 2, (0, 3)), (5, 4, 2, (1, 1)),
                                                             (7, 4, 2, (1, 3)), (2, 1, 4, (2, 0))])
def test_a_global_worker_id_is_a_slice_and_its_worker(worker, hosts, slices, expected):
    assert global_worker("ms", worker, hosts, slices) == expected


@pytest.mark.parametrize("call, message", [
    (lambda: global_worker("ms", 8, 4, 2),
     "--worker 8: job ms has 8 workers on 2 slices of 4, 0-7 numbered across the slices (5 is s1/w1); "
     "or name a slice's worker: --slice 0-1 --worker 0-3"),
    (lambda: slice_node("ms", GANG, 2), "--slice 2: job ms runs on 2 slices, 0-1"),
    (lambda: slice_node("j", GANG[:1], 1), "--slice 1: job j runs on one slice, 0"),
])
def test_out_of_range_values_name_the_option(call, message):
    with pytest.raises(SshRefused) as e:
        call()
    assert str(e.value) == message


@pytest.mark.parametrize("slice_id, worker, node, within", [
    (1, 2, GANG[1], 2),  # --slice 1 --worker 2: s1/w2
    (0, 3, GANG[0], 3),
    (None, 5, GANG[1], 1),  # --worker 5 alone on 2 × 4: the global id, s1/w1
    (None, 0, GANG[0], 0),  # the default: s0/w0
])
def test_the_cli_picks_the_slices_node_and_its_worker(read_nodes, slice_id, worker, node, within):
    picked, w = cli_ssh._pick_worker(None, job(), slice_id, worker)
    assert (picked.name, w) == (node, within)
    assert read_nodes[-1] == node


@pytest.mark.parametrize("slice_id, worker, message", [
    (1, 4, "--worker 4: slice 1 of job ms has 4 workers, 0-3"),
    (2, 0, "--slice 2: job ms runs on 2 slices, 0-1"),
    (None, 9, "--worker 9: job ms has 8 workers on 2 slices of 4"),
])
def test_the_cli_refuses_what_the_job_lacks(read_nodes, slice_id, worker, message):
    with pytest.raises(SshRefused) as e:
        cli_ssh._pick_worker(None, job(), slice_id, worker)
    assert str(e.value).startswith(message)


def test_a_single_slice_job_keeps_its_worker_option(read_nodes):
    single = JobDoc(id="j", state=JobState.running, tpu=GANG[0])
    assert cli_ssh._pick_worker(None, single, None, 3)[1] == 3
    assert cli_ssh._pick_worker(None, single, 0, 1)[1] == 1  # --slice 0 is its one slice
    with pytest.raises(SshRefused) as e:
        cli_ssh._pick_worker(None, single, None, 4)
    assert str(e.value) == "--worker 4: job j has 4 workers, 0-3"
