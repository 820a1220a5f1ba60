"""The chaos soak's short version (issue 17 §3): benchmarks/chaos.py's `run` with fewer jobs and a shorter window,
every fault injected (duplicate pushes, Cloud TPU API 503s, timeouts and spikes, preemptions in every phase,
kill -9 of each service, the executor killed mid-start on the 4-host slice, a worker host killed), and not one
invariant broken. Its own stack, stopped at the end. No timing is asserted: jobs reach their terminal states
through retries, within the soak's generous deadlines."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_benchmark


@pytest.mark.timeout(1500)  # a bound for a hung soak on a loaded machine, not a speed goal
def test_a_short_chaos_soak_breaks_no_invariant(tmp_path):
    chaos = load_benchmark("chaos")
    result = chaos.run(seed=17, jobs=40, minutes=1.0, work=tmp_path)
    print(json.dumps(result))
    assert result["published"] == 40
    assert result["violations"] == {name: 0 for name in chaos.INVARIANTS}, result["examples"]
    assert result["injector_errors"] == 0
    # Every kind of fault was injected at least once (a run that injected nothing proves nothing).
    kinds = {k for k, n in result["faults"].items() if n}
    expected = {"pubsub_pushes_duplicated", "tpu_api_unavailable", "preempt_starting", "preempt_running",
                *(f"kill_{name}" for name in chaos.SERVICES)}
    assert expected <= kinds, sorted(expected - kinds)
