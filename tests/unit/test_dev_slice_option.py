"""`tpuq dev preempt/unhealthy/dirty --slice S` pick a multislice job's slice S (its gang, slice order); a bad S is
refused naming --slice and the slices the job runs on."""

from __future__ import annotations

import pytest

from tpuq.cli.console import CliError
from tpuq.contracts.documents import JobDoc
from tpuq_dev.devcommands import slice_node

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
