"""The quota and billing pre-checks' pure core (tpuq.quota): Cloud Quotas shapes, units, the effective quota."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.cloudchecks import PrecheckCache, PrecheckReader
from tpuq.fleet import FleetFile, ProvisioningModel
from tpuq.quota import (
    QUOTA_FACTS,
    QuotaInfoError,
    QuotaReading,
    QuotaSource,
    QuotaUnit,
    ZoneLimits,
    billing_block_reason,
    chips_from_units,
    effective_quota,
    parse_billing_info,
    parse_quota_info,
    quota_fact,
    skipped_zones,
    units_needed,
    wanted_quota_ids,
)

SPOT, ON_DEMAND = ProvisioningModel.spot, ProvisioningModel.on_demand
V4_SPOT = "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"


def zone(z: str, details: dict | None) -> dict:
    info: dict = {"dimensions": {"zone": z}, "applicableLocations": [z]}
    if details is not None:
        info["details"] = details
    return info


@pytest.mark.parametrize("infos, expected", [
    # an entry for the zone gives its limit; int64 is a JSON string
    ([zone("us-central2-b", {"value": "64"})], {"us-central2-b": 64, "us-east1-d": 0}),
    # proto3 JSON omits zeros: `details: {}` (or no details) is 0, not "unknown" and not the default
    ([zone("us-central2-b", {}), {"details": {"value": "32"}}], {"us-central2-b": 0, "us-east1-d": 32}),
    ([zone("us-central2-b", None), {"details": {"value": 32}}], {"us-central2-b": 0, "us-east1-d": 32}),
    # the entry with no zone key applies to every zone not listed on its own ...
    ([zone("us-central2-b", {"value": "8"}), {"details": {"value": "16"}}],
     {"us-central2-b": 8, "us-east1-d": 16, "europe-west4-a": 16}),
    # ... within its applicableLocations when it names some
    ([{"details": {"value": "16"}, "applicableLocations": ["us-east1-d"]}], {"us-east1-d": 16, "europe-west4-a": 0}),
    ([{"details": {"value": "16"}, "applicableLocations": ["global"]}], {"europe-west4-a": 16}),
    # a region entry covers its zones not listed on their own
    ([{"dimensions": {"region": "us-east1"}, "details": {"value": "4"}}], {"us-east1-d": 4, "us-central2-b": 0}),
    # no entry for the zone and no default: no quota
    ([], {"us-central2-b": 0}),
])
def test_limits_by_zone_from_dimensions_infos(infos, expected):
    limits = parse_quota_info({"quotaId": V4_SPOT, "dimensionsInfos": infos})
    assert {z: limits.limit(z) for z in expected} == expected


@pytest.mark.parametrize("body, where", [
    ({"dimensionsInfos": {"zone": "x"}}, "dimensionsInfos"),
    ({"dimensionsInfos": [zone("us-central2-b", {"value": "many"})]}, "dimensionsInfos[0].details.value"),
    ({"dimensionsInfos": [{"dimensions": "zone"}]}, "dimensionsInfos[0].dimensions"),
])
def test_a_misshapen_quota_info_names_the_field(body, where):
    with pytest.raises(QuotaInfoError) as err:
        parse_quota_info(body)
    assert str(err.value).startswith(where + ":") or str(err.value).startswith(where + " ")


@pytest.mark.parametrize("tpu_type, unit, needed, chips", [
    ("v4-8", QuotaUnit.tensorcores, 8, 4),       # v4 names count TensorCores, and so does v4 quota
    ("v4-32", QuotaUnit.tensorcores, 32, 16),
    ("v5litepod-8", QuotaUnit.chips, 8, 8),      # v5e and v6e names count chips, and so does their quota
    ("v5e-64", QuotaUnit.chips, 64, 64),
    ("v6e-64", QuotaUnit.chips, 64, 64),
])
def test_a_slice_needs_the_number_in_its_name_in_its_quotas_unit(tpu_type, unit, needed, chips):
    assert units_needed(tpu_type, unit) == needed
    assert chips_from_units(needed, unit) == chips


def test_the_facts_name_five_quota_ids_and_their_units():
    assert {(f, m.value): (q.quota_id, q.unit.value) for (f, m), q in QUOTA_FACTS.items()} == {
        ("v4", "spot"): (V4_SPOT, "TensorCores"),
        ("v5litepod", "spot"): ("TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI", "chips"),
        ("v5litepod", "on_demand"): ("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "chips"),
        ("v6e", "spot"): ("TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "chips"),
        ("v6e", "on_demand"): ("TPUV6EPerProjectPerZoneForTPUAPI", "chips"),
    }
    for family, model in [("v2", SPOT), ("v3", SPOT), ("v4", ON_DEMAND), ("v5p", SPOT)]:
        assert quota_fact(family, model) is None


def fleet(tpus: list[dict], quota: dict | None = None) -> FleetFile:
    return FleetFile.model_validate({"name": "f", "project": "p", "tpus": tpus, **({"quota": quota} if quota else {})})


ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]


def test_declared_wins_else_the_api_converted_to_chips_else_not_checked_and_said():
    f = fleet([{"id": "a", "type": "v4-32", "zones": ZONES},
               {"id": "b", "type": "v5p-8", "zones": ZONES[:1]},
               {"id": "c", "type": "v4-8", "zones": ZONES[:1], "provisioning_model": "on_demand"}],
              quota={ZONES[0]: {"v4": {"spot": 16}}})
    assert wanted_quota_ids(f) == [V4_SPOT]
    limits = ZoneLimits({ZONES[0]: 999, ZONES[1]: 64}, default=None)
    quota = effective_quota(f, {V4_SPOT: QuotaReading(V4_SPOT, limits=limits)})
    a0, a1, a2 = (quota.get(z, "v4", SPOT) for z in ZONES)
    assert (a0.chips, a0.source) == (16, QuotaSource.declared)           # declared overrides the API
    assert (a1.chips, a1.source) == (32, QuotaSource.api)                # 64 TensorCores = 32 chips
    assert "64 TensorCores" in a1.detail and V4_SPOT in a1.detail
    assert (a2.chips, a2.source) == (0, QuotaSource.api)                 # not listed, no default: none
    b = quota.get(ZONES[0], "v5p", SPOT)
    c = quota.get(ZONES[0], "v4", ON_DEMAND)
    for q, said in [(b, "v5p spot"), (c, "v4 on-demand")]:
        assert q.chips is None and q.source is QuotaSource.fallback and f"no Cloud Quotas ID known for {said}" in q.detail
    assert quota.problems == ()
    assert [(s["zone"], s["type"]) for s in skipped_zones(f, quota)] == [(ZONES[2], "v4-32")]
    assert "0 chips < 16 for one v4-32" in skipped_zones(f, quota)[0]["reason"]


def test_an_unreadable_quota_falls_back_to_the_declared_one_with_one_line():
    f = fleet([{"id": "a", "type": "v4-32", "zones": ZONES[:2]}], quota={ZONES[0]: {"v4": {"spot": 32}}})
    quota = effective_quota(f, {V4_SPOT: QuotaReading(V4_SPOT, error="HTTP 403 PERMISSION_DENIED: no")})
    assert quota.chips(ZONES[0], "v4", SPOT) == 32
    assert quota.chips(ZONES[1], "v4", SPOT) is None  # nothing declared: not checked, never "no quota"
    assert quota.problems == (f"quota {V4_SPOT}: HTTP 403 PERMISSION_DENIED: no; using the declared quota",)
    assert skipped_zones(f, quota) == []


@pytest.mark.parametrize("body, enabled", [
    ({"name": "projects/p/billingInfo", "billingEnabled": True, "billingAccountName": "billingAccounts/x"}, True),
    ({"name": "projects/p/billingInfo", "billingEnabled": False}, False),
    ({"name": "projects/p/billingInfo", "projectId": "p"}, False),  # proto3 JSON leaves a false out
])
def test_billing_enabled_is_false_when_left_out(body, enabled):
    assert parse_billing_info(body).enabled is enabled
    assert parse_billing_info(body).disabled is (not enabled)


def test_billing_block_reason_says_billing_is_disabled():
    assert billing_block_reason("p").startswith("billing is disabled on project p")


class _Response:
    def __init__(self, status: int, body):
        self.status_code, self._body = status, body
        self.text = str(body)

    def json(self):
        return self._body


class _Session:
    def __init__(self, answers: dict[str, _Response]):
        self.answers, self.urls = answers, []

    def get(self, url, timeout=None):
        self.urls.append(url)
        for key, answer in self.answers.items():
            if key in url:
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return _Response(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no"}})


def test_the_reader_uses_v1_paths_and_turns_every_failure_into_one_line():
    f = fleet([{"id": "a", "type": "v4-32", "zones": ZONES[:1]}])
    session = _Session({
        "quotaInfos/": _Response(403, {"error": {"code": 403, "status": "PERMISSION_DENIED",
                                                 "message": "Permission 'cloudquotas.quotas.get' denied"}}),
        "billingInfo": ConnectionError("refused"),
    })
    checks = PrecheckReader(session, "http://q", "http://b/").read(f, datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert session.urls == [
        f"http://q/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos/{V4_SPOT}",
        "http://b/v1/projects/p/billingInfo",
    ]
    assert checks.quota.chips(ZONES[0], "v4", SPOT) is None
    assert checks.billing.enabled is None
    assert checks.problems == [
        f"quota {V4_SPOT}: HTTP 403 PERMISSION_DENIED: Permission 'cloudquotas.quotas.get' denied; "
        "using the declared quota",
        "billing: ConnectionError: refused; not checked",
    ]


def test_the_cache_rereads_after_its_ttl_or_a_new_fleet_file_and_always_while_billing_is_off():
    f = fleet([{"id": "a", "type": "v4-32", "zones": ZONES[:1]}])
    on = {"billingInfo": _Response(200, {"billingEnabled": True}),
          "quotaInfos/": _Response(200, {"dimensionsInfos": []})}
    session = _Session(on)
    cache = PrecheckCache(PrecheckReader(session, "http://q", "http://b"), ttl_seconds=60)
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    cache.get(f, t0)
    cache.get(f, t0 + timedelta(seconds=59))
    assert len(session.urls) == 2
    cache.get(f, t0 + timedelta(seconds=60))
    assert len(session.urls) == 4
    other = fleet([{"id": "a", "type": "v4-32", "zones": ZONES[:2]}])
    cache.get(other, t0 + timedelta(seconds=61))
    assert len(session.urls) == 6
    session.answers["billingInfo"] = _Response(200, {})
    cache.get(other, t0 + timedelta(seconds=200))
    assert cache.get(other, t0 + timedelta(seconds=201)).billing.disabled
    assert len(session.urls) == 10  # billing off: read again on every message
