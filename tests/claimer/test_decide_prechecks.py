"""decide_request_received with the pre-checks as input (ClaimState.prechecks): the effective quota bounds the race, and billing
found off blocks the project before any create. It reads nothing itself."""

from __future__ import annotations

import random
from datetime import datetime, timezone

from tpuq.claimer.decide import decide_request_received
from tpuq.claimer.model import ClaimState, RequestReceived
from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.contracts.messages import CapacityRequest
from tpuq.capacity.quota import (BillingState, EffectiveQuota, Prechecks, QuotaReading, QuotaSource, ZoneQuota,
                                 effective_quota, parse_quota_info)

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
    effects = decide_request_received(state, RequestReceived(request), NOW, random.Random(1))
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


# ------------------------------------------------------------------ Cloud Quotas bodies -> decide

V4_ZONE_ID = "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"
V4_REGION_ID = "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI"  # marin#87's refusal names it


def quota_info(quota_id: str, infos: list[dict]) -> dict:
    scope = "region" if "PerRegion" in quota_id else "zone"
    return {"name": f"projects/123/locations/global/services/tpu.googleapis.com/quotaInfos/{quota_id}",
            "quotaId": quota_id, "metric": f"tpu.googleapis.com/{quota_id.lower()}", "service": "tpu.googleapis.com",
            "isPrecise": True, "containerType": "PROJECT", "dimensions": [scope], "metricDisplayName": quota_id,
            "quotaDisplayName": quota_id, "metricUnit": f"1/{{project}}/{{{scope}}}", "dimensionsInfos": infos,
            "isConcurrent": False}


def api_prechecks(f: FleetFile, zone_infos: list[dict], region_infos: list[dict]) -> Prechecks:
    readings = {b["quotaId"]: QuotaReading(b["quotaId"], limits=parse_quota_info(b))
                for b in (quota_info(V4_ZONE_ID, zone_infos), quota_info(V4_REGION_ID, region_infos))}
    return Prechecks(effective_quota(f, readings), BillingState(True))


def two_region_fleet() -> FleetFile:
    return FleetFile.model_validate({"name": "f1", "project": "p", "owner_prefix": "tq", "tpus": [
        {"id": "v4", "type": "v4-32", "zones": [*ZONES, "us-east1-d"], "count": 10}]})


def test_a_zone_whose_quota_is_only_a_region_entry_is_raced_and_the_region_is_shared():
    """The zone ID lists us-east1-d only; us-central2's region entry (32 TensorCores: one v4-32) covers its three
    zones together. Before, a zone the zone ID did not list had no quota, so only us-east1-d was raced."""
    f = two_region_fleet()
    checks = api_prechecks(f, [{"dimensions": {"zone": "us-east1-d"}, "details": {"value": "64"},
                                "applicableLocations": ["us-east1-d"]}],
                           [{"dimensions": {"region": "us-central2"}, "details": {"value": "32"},
                             "applicableLocations": ["us-central2"]}])
    zones, _ = creates(ClaimState(f, prechecks=checks))
    assert zones == [ZONES[0], "us-east1-d"]  # one v4-32 for the whole region: its first zone, not all three


def test_a_region_entry_of_two_slices_races_two_of_its_zones():
    f = two_region_fleet()
    checks = api_prechecks(f, [], [{"dimensions": {"region": "us-central2"}, "details": {"value": "64"},
                                    "applicableLocations": ["us-central2"]}])
    assert creates(ClaimState(f, prechecks=checks))[0] == ZONES[:2]  # us-east1: covered by neither ID, no quota


def test_minus_one_is_raced_as_unlimited():
    """-1 is unlimited (production-facts.md). Before, it read as -1 chips, less than one slice: zone skipped."""
    f = fleet()
    checks = api_prechecks(f, [{"dimensions": {"zone": z}, "details": {"value": "-1"}, "applicableLocations": [z]}
                               for z in ZONES], [])
    assert creates(ClaimState(f, prechecks=checks))[0] == ZONES
    region_unlimited = api_prechecks(f, [], [{"dimensions": {"region": "us-central2"}, "details": {"value": "-1"},
                                              "applicableLocations": ["us-central2"]}])
    assert creates(ClaimState(f, prechecks=region_unlimited))[0] == ZONES


def test_serving_and_training_v5e_pools_are_counted_apart():
    """A v5litepod-8 (serving pool) racing in a zone takes nothing from v5litepod-16's training quota there."""
    f = FleetFile.model_validate({"name": "f1", "project": "p", "owner_prefix": "tq", "tpus": [
        {"id": "small", "type": "v5litepod-8", "zones": ZONES[:1], "count": 5},
        {"id": "big", "type": "v5litepod-16", "zones": ZONES[:1], "count": 5}]})
    entries = {(ZONES[0], "v5litepod-serving", SPOT): ZoneQuota(8, QuotaSource.api, "test"),
               (ZONES[0], "v5litepod", SPOT): ZoneQuota(16, QuotaSource.api, "test")}
    state = ClaimState(f, prechecks=Prechecks(EffectiveQuota(entries), BillingState(True)))
    small = decide_request_received(state, RequestReceived(CapacityRequest(request_id="r1", fleet="f1", types=["v5litepod-8"],
                                                          count=1)), NOW, random.Random(1))
    state = ClaimState(f, qrs={c.qr.qr_id: c.qr for c in small.creates}, prechecks=state.prechecks,
                       requests=dict(small.requests))
    big = decide_request_received(state, RequestReceived(CapacityRequest(request_id="r2", fleet="f1", types=["v5litepod-16"],
                                                        count=1)), NOW, random.Random(1))
    assert [c.qr.type for c in small.creates + big.creates] == ["v5litepod-8", "v5litepod-16"]
