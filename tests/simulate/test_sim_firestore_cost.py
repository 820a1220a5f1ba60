"""What the cost table of docs/DEPLOYING.md says of Firestore, measured on the services' own code: an idle deployment
(the standard fleet, nothing queued, nothing running) stays within Firestore's free tier of 50,000 document reads and
20,000 writes a day (https://cloud.google.com/firestore/pricing), every minute's tick handled."""

from __future__ import annotations

import pytest

from tpuq_dev.simulate_cli import EXAMPLE_FILES, EXAMPLES, read_inputs
from tpuq_dev.simulate.run import simulate

DAY = 86400.0


@pytest.fixture(scope="module")
def idle_day():
    """One simulated day of the standard fleet with nothing queued (the tests below only read its counts)."""
    inputs = read_inputs(EXAMPLES / EXAMPLE_FILES["fleet"], EXAMPLES / EXAMPLE_FILES["scenario"],
                         EXAMPLES / EXAMPLE_FILES["workload"], 0, DAY)
    return simulate("tpuq", fleet=inputs.fleet, scenario=inputs.scenario, jobs=[], horizon=DAY, seed=0)


def test_an_idle_deployment_stays_within_firestores_free_tier(idle_day):
    run = idle_day
    ops = run.driver.firestore_ops(DAY)
    assert run.driver.service_ticks_skipped > 0  # the skipped ticks' reads are counted all the same
    assert 0 < ops.reads_per_day < 50_000 and ops.writes_per_day < 20_000, ops
    assert ops.deletes == 0 and ops.probe_writes == 0  # nothing ran


def test_the_reads_are_split_by_subscription_and_an_idle_schedulers_ticks_read_a_few_documents(idle_day):
    """`firestore.by_subscription` accounts for every billed operation; the scheduler's tick reads its backstops'
    state, the late-assignment query and whether a job is pending, and its backstops every 15 minutes (issue 34 §1:
    before, about 11 reads a tick, 15,800 a day)."""
    run = idle_day
    ops = run.driver.firestore_ops(DAY)
    split = ops.by_subscription
    assert sum(row["reads"] for row in split.values()) == ops.reads
    assert sum(row["writes"] for row in split.values()) == ops.writes
    assert {"scheduler-ticks", "claimer-ticks", "janitor-ticks", "executor-ticks"} <= set(split)
    assert split["scheduler-ticks"]["reads_per_day"] <= 6_000, split["scheduler-ticks"]


def test_an_idle_deployment_reads_less_than_5000_documents_a_day_its_ticks_routed(idle_day):
    """Issue 34's goal for an idle deployment. The clock's tick reaches the janitor, whose one query finds the
    services whose tick has work (`tpuq.runtime.tickdue`): 1,440 reads a day, the rest each service's work on its
    cadence (the backstops every 15 minutes, the orphan scan every 10). Before (2026-12-04) every service read its
    state each minute: 12,339 reads a day; the janitor alone 5,859."""
    ops = idle_day.driver.firestore_ops(DAY)
    split = ops.by_subscription
    assert ops.reads_per_day <= 5_000, split
    assert split["janitor-ticks"]["reads_per_day"] <= 3_000, split["janitor-ticks"]
    for routed in ("scheduler-ticks", "claimer-ticks", "executor-ticks"):
        assert split[routed]["reads_per_day"] <= 600, (routed, split[routed])
