"""`tpuq dev up`'s words for the fake TPU's scenario: times in real seconds at the stack's time scale."""

from __future__ import annotations

import pytest

from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq_dev.devstack.describe import scenario_lines


@pytest.mark.parametrize("zone, line", [
    ({"quota": {"v4": {"spot": 64, "on_demand": 8}}}, "zone us-central2-b: quota v4 64 spot + 8 on-demand chips"),
    ({"stockouts": [{"family": "v4", "start": 60, "end": 120, "effect": "wait"}]},
     "zone us-central2-b: v4 stocked out from 1 s until 2 s (requests wait)"),
    ({"stockouts": [{}]}, "zone us-central2-b: every family stocked out from the start (requests fail)"),
    ({"failures": [{"family": "v6e", "error": "unknown", "start": 0}]},
     "zone us-central2-b: v6e requests fail with unknown from the start"),
])
def test_zone_lines(zone, line):
    assert line in scenario_lines(parse_scenario({"zones": {"us-central2-b": zone}}), 60)


@pytest.mark.parametrize("preemption, line", [
    ({"after_active": 900, "family": "v4", "zone": "us-central2-c"},
     "zone us-central2-c preempts every v4 node 15 s after ACTIVE"),
    ({"at": 120}, "every zone preempts every node at 2 s"),
])
def test_preemption_lines(preemption, line):
    assert line in scenario_lines(parse_scenario({"preemption": {"scripted": [preemption]}}), 60)
