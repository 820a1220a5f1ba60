"""decide with the pre-checks as input (ClaimState.prechecks): the effective quota bounds the race, and billing
found off blocks the project before any create. decide reads nothing itself."""

from __future__ import annotations

import random
from datetime import datetime, timezone

from tpuq.claimer.decide import decide
from tpuq.claimer.model import ClaimState, RequestReceived
from tpuq.fleet import FleetFile, ProvisioningModel
from tpuq.messages import CapacityRequest
from tpuq.quota import BillingState, EffectiveQuota, Prechecks, QuotaSource, ZoneQuota

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]
SPOT = ProvisioningModel.spot


def fleet() -> FleetFile:
    return FleetFile.model_validate({"name": "f1", "project": "p", "owner_prefix": "tq",
                                     "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 10}]})


def prechecks(chips_by_zone: dict[str, int | None], billing: bool | None = True) -> Prechecks:
    entries = {(z, "v4", SPOT): ZoneQuota(c, QuotaSource.api, "test") for z, c in chips_by_zone.items()}
    return Prechecks(EffectiveQuota(entries), BillingState(billing))


def creates(state: ClaimState) -> list[str]:
    request = CapacityRequest(request_id="r1", fleet="f1", types=["v4-32"], count=1)
    effects = decide(state, RequestReceived(request), NOW, random.Random(1))
    return sorted(c.qr.zone for c in effects.creates), effects


def test_no_prechecks_and_no_declared_quota_race_everywhere():
    assert creates(ClaimState(fleet()))[0] == ZONES


def test_the_effective_quota_passed_in_bounds_the_race():
    state = ClaimState(fleet(), prechecks=prechecks({ZONES[0]: 16, ZONES[1]: 8, ZONES[2]: None}))
    zones, effects = creates(state)
    assert zones == [ZONES[0], ZONES[2]]  # 8 chips < one v4-32; None: not checked
    assert effects.status is None


def test_billing_found_off_blocks_the_project_with_its_reason_and_creates_nothing():
    zones, effects = creates(ClaimState(fleet(), prechecks=prechecks({z: 64 for z in ZONES}, billing=False)))
    assert zones == []
    assert effects.status.blocked.startswith("billing is disabled on project p")
    assert effects.status.blocked_version == fleet().version


def test_billing_unreadable_never_blocks():
    zones, effects = creates(ClaimState(fleet(), prechecks=prechecks({z: 64 for z in ZONES}, billing=None)))
    assert zones == ZONES and effects.status is None
