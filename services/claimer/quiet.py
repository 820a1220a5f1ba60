"""Pure: may a tick stop at its first reads? (issue 34 §1: a quiet tick's reads are bounded by what is live)

A tick first reads only the fleet's open requests and, with none, its live queued resources
(`statestore.load_open_requests`, `load_live_qrs`). The rest of the claim state (zone targets, fleet status,
brakes, quota and billing) matters only for

- planning an open request (creates, back-offs, the brakes' gate), and
- acting on a queued resource whose exact GET says something new (a state change, a failure to classify and
  back off, a node health change, a delete still to send).

With no open request, `decide_observed` on the live queued resources alone decides exactly as on the full state,
except for recording a billing block or its end (`plan_all`; recorded when the next request arrives, whose handler
reads billing afresh): every branch that reads a target, the status or the brakes also changes a queued resource,
announces or deletes, so "no effects here" means "no effects on the full state".
"""

from __future__ import annotations

import random
from datetime import datetime

from tpuq.claimer.decide import decide_observed
from tpuq.claimer.model import ClaimState, Observation, Observed


def tick_needs_full_state(live: ClaimState, observations: dict[str, Observation], now: datetime) -> bool:
    """True: load the whole claim state and run the watch pass. `live`: the tick's first reads (live queued
    resources, open requests; no targets, status or brakes); `observations`: the exact GETs of `live.qrs`."""
    if live.requests:
        return True  # an open request is planned on every pass: that needs targets, status and brakes
    if not live.qrs:
        return False
    # A throwaway generator: only whether anything would happen is asked here; the real pass draws from the
    # handler's own.
    effects = decide_observed(live, Observed(observations, plan=True), now, random.Random(0))
    return not effects.empty
