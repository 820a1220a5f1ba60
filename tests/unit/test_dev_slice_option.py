"""`tpuq dev preempt/unhealthy/dirty --slice S` pick a multislice job's slice S (its gang, slice order); a bad S is
refused naming --slice and the slices the job runs on. They act on a job's slice while the job holds it; only
`dirty` also takes an ended job's last slice (preempting it would strike the job that runs there now)."""

from __future__ import annotations

import pytest

from tpuq.cli.console import CliError
from tpuq.contracts.documents import JobDoc
from tpuq_dev.devcommands import check_on_its_slice, slice_node

GANG = [f"projects/p/locations/z/nodes/tq-r-0-z-{i}" for i in range(2)]


def job(**fields) -> JobDoc:
    return JobDoc.from_doc({"state": "running", "attempt": 1, **fields}, "ms")


def test_the_slice_is_the_gangs_and_slice_0_by_default():
    gang = job(tpu=GANG[0], gang=GANG)
    assert [slice_node(gang, i) for i in range(2)] == GANG
    assert slice_node(job(tpu="projects/p/locations/z/nodes/one"), 0).endswith("/one")


@pytest.mark.parametrize("fields, index, says", [
    ({"tpu": GANG[0], "gang": GANG}, 2, "--slice 2: job ms runs on 2 slices, 0-1"),
    ({"tpu": "projects/p/locations/z/nodes/one"}, 1, "--slice 1: job ms runs on one slice, 0"),
])
def test_a_slice_past_the_jobs_is_refused_naming_the_option(fields, index, says):
    with pytest.raises(CliError, match=says):
        slice_node(job(**fields), index)


NODE = "projects/p/locations/z/nodes/one"


@pytest.mark.parametrize("command", ["preempt", "unhealthy", "dirty"])
@pytest.mark.parametrize("state", ["assigned", "running"])
def test_a_job_on_its_slice_is_acted_on(command, state):
    check_on_its_slice(job(state=state, tpu=NODE), command)


@pytest.mark.parametrize("command", ["preempt", "unhealthy"])
@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_an_ended_jobs_slice_is_not_preempted_nor_made_unhealthy(command, state):
    with pytest.raises(CliError, match=rf"job ms has ended \({state}\): its last slice may run another job now; "
                                       rf"`tpuq dev {command}` acts on the slice of a job that is assigned or running"):
        check_on_its_slice(job(state=state, tpu=NODE), command)


def test_an_ended_jobs_last_slice_can_be_left_dirty():
    check_on_its_slice(job(state="succeeded", tpu=NODE), "dirty")


@pytest.mark.parametrize("command", ["preempt", "unhealthy", "dirty"])
@pytest.mark.parametrize("fields", [{}, {"tpu": NODE}], ids=["never placed", "requeued after an attempt"])
def test_a_pending_job_is_on_no_slice(command, fields):
    with pytest.raises(CliError, match="job ms is pending: it is on no TPU slice now"):
        check_on_its_slice(job(state="pending", **fields), command)
