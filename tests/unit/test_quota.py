"""The quota and billing pre-checks' pure core (tpuq.capacity.quota): Cloud Quotas shapes, units, the effective quota."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.capacity.cloudchecks import PrecheckCache, PrecheckReader
from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.contracts.tputypes import parse_accelerator_type
from tpuq.capacity.quota import (
    QUOTA_FACTS,
    SERVING_POOL,
    QuotaInfoError,
    QuotaReading,
    QuotaSource,
    Prechecks,
    QuotaUnit,
    ZoneLimits,
    billing_block_reason,
    chips_from_units,
    effective_quota,
    parse_billing_info,
    parse_quota_info,
    quota_fact,
    quota_pool,
    skipped_zones,
    units_needed,
    wanted_quota_ids,
)

SPOT, ON_DEMAND = ProvisioningModel.spot, ProvisioningModel.on_demand
V4_SPOT = "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"
V4_SPOT_REGION = "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI"  # the one marin#87's refusal names


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


def test_the_facts_name_each_pools_zone_and_region_quota_ids_and_their_units():
    def ids(pool, model):
        return [(f.quota_id, f.unit.value, f.scope.value) for f in QUOTA_FACTS[(pool, model)]]

    assert set(QUOTA_FACTS) == {("v4", SPOT), ("v5litepod", SPOT), ("v5litepod", ON_DEMAND), (SERVING_POOL, SPOT),
                                (SERVING_POOL, ON_DEMAND), ("v6e", SPOT), ("v6e", ON_DEMAND)}
    assert ids("v4", SPOT) == [(V4_SPOT, "TensorCores", "zone"), (V4_SPOT_REGION, "TensorCores", "region")]
    assert ids("v5litepod", SPOT) == [("TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI", "chips", "zone"),
                                      ("TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI", "chips", "region")]
    assert ids("v5litepod", ON_DEMAND) == [("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "chips", "zone"),
                                           ("TPUV5sLitepodPerProjectPerRegionForTPUAPI", "chips", "region")]
    assert ids(SERVING_POOL, SPOT) == [("TPUV5sPreemptibleLitepodServingPerProjectPerZoneForTPUAPI", "chips", "zone")]
    assert ids(SERVING_POOL, ON_DEMAND) == [("TPUV5sLitepodServingPerProjectPerZoneForTPUAPI", "chips", "zone")]
    assert ids("v6e", SPOT) == [("TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", "chips", "zone"),
                                ("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "chips", "region")]
    assert ids("v6e", ON_DEMAND) == [("TPUV6EPerProjectPerZoneForTPUAPI", "chips", "zone"),
                                     ("TPUV6EPerProjectPerRegionForTPUAPI", "chips", "region")]
    for family, model in [("v2", SPOT), ("v3", SPOT), ("v4", ON_DEMAND), ("v5p", SPOT)]:
        assert quota_fact(family, model) is None


@pytest.mark.parametrize("tpu_type, pool", [
    ("v5litepod-1", SERVING_POOL), ("v5e-4", SERVING_POOL), ("v5litepod-8", SERVING_POOL),  # single-host: serving
    ("v5litepod-16", "v5litepod"), ("v5e-256", "v5litepod"),
    ("v6e-8", "v6e"), ("v4-8", "v4"), ("v5p-8", "v5p"),
])
def test_small_v5e_slices_draw_on_the_serving_pool(tpu_type, pool):
    assert quota_pool(tpu_type) == pool


def fleet(tpus: list[dict], quota: dict | None = None) -> FleetFile:
    return FleetFile.model_validate({"name": "f", "project": "p", "tpus": tpus, **({"quota": quota} if quota else {})})


ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]


def test_declared_wins_else_the_api_converted_to_chips_else_not_checked_and_said():
    f = fleet([{"id": "a", "type": "v4-32", "zones": ZONES},
               {"id": "b", "type": "v5p-8", "zones": ZONES[:1]},
               {"id": "c", "type": "v4-8", "zones": ZONES[:1], "provisioning_model": "on_demand"}],
              quota={ZONES[0]: {"v4": {"spot": 16}}})
    assert wanted_quota_ids(f) == [V4_SPOT, V4_SPOT_REGION]
    limits = ZoneLimits({ZONES[0]: 999, ZONES[1]: 64}, default=None)
    quota = effective_quota(f, {V4_SPOT: QuotaReading(V4_SPOT, limits=limits),
                                V4_SPOT_REGION: QuotaReading(V4_SPOT_REGION, limits=ZoneLimits())})
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
    quota = effective_quota(f, {q: QuotaReading(q, error="HTTP 403 PERMISSION_DENIED: no")
                                for q in (V4_SPOT, V4_SPOT_REGION)})
    assert quota.chips(ZONES[0], "v4", SPOT) == 32
    assert quota.chips(ZONES[1], "v4", SPOT) is None  # nothing declared: not checked, never "no quota"
    assert quota.problems == (f"quota {V4_SPOT}: HTTP 403 PERMISSION_DENIED: no; using the declared quota",
                              f"quota {V4_SPOT_REGION}: HTTP 403 PERMISSION_DENIED: no; using the declared quota")
    assert skipped_zones(f, quota) == []


# ------------------------------------------------------------------ per-region IDs, serving pools, -1

def quota_info_body(quota_id: str, infos: list[dict]) -> dict:
    """A QuotaInfo as cloudquotas v1 sends it (QuotaInfo reference: proto3 JSON, int64 values as strings, false
    and empty fields left out: `refreshInterval` is for rate quotas only). The metric names are illustrative; tpuq
    reads only quotaId and dimensionsInfos."""
    scope = "region" if "PerRegion" in quota_id else "zone"
    return {
        "name": f"projects/123/locations/global/services/tpu.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": f"tpu.googleapis.com/{quota_id.lower()}",
        "service": "tpu.googleapis.com",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": [scope],
        "metricDisplayName": quota_id,
        "quotaDisplayName": f"{quota_id} per project per {scope}",
        "metricUnit": f"1/{{project}}/{{{scope}}}",
        "dimensionsInfos": infos,
        "isConcurrent": False,
    }


def zone_entry(z: str, value: str | None) -> dict:
    # Real zone entries may carry the zone's region too (cloudquotas DimensionsInfo): the zone key decides.
    return {"dimensions": {"region": z.rsplit("-", 1)[0], "zone": z},
            "details": {"value": value} if value is not None else {}, "applicableLocations": [z]}


def region_entry(r: str, value: str | None) -> dict:
    return {"dimensions": {"region": r}, "details": {"value": value} if value is not None else {},
            "applicableLocations": [r]}


def readings_of(*bodies: dict) -> dict[str, QuotaReading]:
    return {b["quotaId"]: QuotaReading(b["quotaId"], limits=parse_quota_info(b)) for b in bodies}


US2 = ["us-central2-a", "us-central2-b", "us-central2-c"]
EU = "europe-west4-a"


# Each ID family: (fleet type, tier, zone ID, region ID or None, units per chip)
FAMILIES = [
    ("v4-32", "spot", V4_SPOT, V4_SPOT_REGION, 2),
    ("v5litepod-16", "spot", "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI",
     "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI", 1),
    ("v5litepod-16", "on_demand", "TPUV5sLitepodPerProjectPerZoneForTPUAPI",
     "TPUV5sLitepodPerProjectPerRegionForTPUAPI", 1),
    ("v5litepod-8", "spot", "TPUV5sPreemptibleLitepodServingPerProjectPerZoneForTPUAPI", None, 1),
    ("v5litepod-4", "on_demand", "TPUV5sLitepodServingPerProjectPerZoneForTPUAPI", None, 1),
    ("v6e-8", "spot", "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI",
     "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", 1),
    ("v6e-8", "on_demand", "TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6EPerProjectPerRegionForTPUAPI", 1),
]


@pytest.mark.parametrize("tpu_type, tier, zone_id, region_id, per_chip", FAMILIES)
def test_each_id_family_reads_zone_entries_then_region_entries(tpu_type, tier, zone_id, region_id, per_chip):
    """us-central2-a has its own entry; -b and -c have none, so us-central2's region entry bounds them (a region
    ID's entry is shared by the region's zones; a region-keyed entry in a zone ID is each zone's own value);
    europe-west4-a is covered by nothing: no quota."""
    model = ProvisioningModel(tier)
    f = fleet([{"id": "e", "type": tpu_type, "zones": US2 + [EU], "provisioning_model": tier}])
    chips = parse_accelerator_type(tpu_type).chips
    assert wanted_quota_ids(f) == [zone_id] + ([region_id] if region_id else [])
    zone_body = quota_info_body(zone_id, [zone_entry(US2[0], str(2 * chips * per_chip))]
                                + ([] if region_id else [region_entry("us-central2", str(chips * per_chip))]))
    bodies = [zone_body] + ([quota_info_body(region_id, [region_entry("us-central2", str(chips * per_chip))])]
                            if region_id else [])
    quota = effective_quota(f, readings_of(*bodies))
    a, b, c, eu = (quota.of(z, parse_accelerator_type(tpu_type), model) for z in US2 + [EU])
    assert quota.problems == ()
    assert (a.chips, a.source) == (2 * chips, QuotaSource.api)
    if region_id:  # one slice's worth for the whole region: the zone's own 2 slices are bounded by it too
        assert a.region.chips == chips and a.bound == chips
        assert (b.chips, b.region.chips, b.bound) == (None, chips, chips)
        assert b.describe().startswith(f"no zone limit (Cloud Quotas {zone_id}: no entry for {US2[1]}); "
                                       f"region us-central2: {chips} chips shared by its zones (Cloud Quotas "
                                       f"{region_id}: {chips * per_chip} ")
    else:
        assert (b.chips, b.region, c.chips) == (chips, None, chips)
    assert (eu.chips, eu.bound) == (0, 0)
    assert [(s["zone"], s["type"]) for s in skipped_zones(f, quota)] == [(EU, tpu_type)]


def test_a_region_ids_default_entry_names_regions_in_its_applicable_locations():
    body = quota_info_body(V4_SPOT_REGION, [region_entry("us-central2", "64"),
                                            {"details": {"value": "16"}, "applicableLocations": ["europe-west4"]}])
    limits = parse_quota_info(body)
    assert (limits.find_region("us-central2"), limits.find_region("europe-west4"), limits.find_region("us-east1")) \
        == (64, 16, None)
    assert limits.find("europe-west4-a") == 16  # a default that names the zone's region covers the zone


@pytest.mark.parametrize("zone_value, region_value", [("-1", None), ("-1", "-1"), (None, "-1")])
def test_minus_one_is_unlimited_wherever_it_is_read(zone_value, region_value):
    """Cloud Quotas' -1 is unlimited (production-facts.md). Read as a number it was -1 chips (v4: -1 // 2), less
    than any slice, and the zone was skipped as having no quota."""
    f = fleet([{"id": "a", "type": "v4-32", "zones": US2[:1]}])
    bodies = [quota_info_body(V4_SPOT, [zone_entry(US2[0], zone_value)] if zone_value else []),
              quota_info_body(V4_SPOT_REGION, [region_entry("us-central2", region_value)] if region_value else [])]
    quota = effective_quota(f, readings_of(*bodies))
    q = quota.get(US2[0], "v4", SPOT)
    assert q.source is QuotaSource.api and q.bound is None and q.is_unlimited
    assert skipped_zones(f, quota) == []
    assert "unlimited" in q.describe() and "-1 (unlimited)" in q.describe()


def test_minus_one_in_the_zone_still_leaves_the_regions_limit():
    f = fleet([{"id": "a", "type": "v4-32", "zones": US2[:1]}])
    quota = effective_quota(f, readings_of(quota_info_body(V4_SPOT, [zone_entry(US2[0], "-1")]),
                                           quota_info_body(V4_SPOT_REGION, [region_entry("us-central2", "16")])))
    q = quota.get(US2[0], "v4", SPOT)
    assert (q.chips, q.unlimited, q.region.chips, q.bound, q.is_unlimited) == (None, True, 8, 8, False)
    assert skipped_zones(f, quota)[0]["reason"].startswith("no quota: region us-central2 has 8 chips < 16 for one")


def test_a_negative_value_other_than_minus_one_is_a_misshapen_answer():
    with pytest.raises(QuotaInfoError, match=r"dimensionsInfos\[0\]\.details\.value: -2"):
        parse_quota_info(quota_info_body(V4_SPOT, [zone_entry(US2[0], "-2")]))


def test_an_unreadable_region_id_is_one_line_and_the_zone_id_still_bounds():
    f = fleet([{"id": "a", "type": "v4-32", "zones": US2[:1]}])
    readings = {**readings_of(quota_info_body(V4_SPOT, [zone_entry(US2[0], "64")])),
                V4_SPOT_REGION: QuotaReading(V4_SPOT_REGION, error="HTTP 404 NOT_FOUND: no")}
    quota = effective_quota(f, readings)
    assert quota.chips(US2[0], "v4", SPOT) == 32 and quota.get(US2[0], "v4", SPOT).region is None
    assert quota.problems == (f"quota {V4_SPOT_REGION}: HTTP 404 NOT_FOUND: no; using the declared quota",)


def test_a_declared_family_covers_its_serving_pool_and_skips_both_ids():
    f = fleet([{"id": "s", "type": "v5litepod-8", "zones": US2[:1]}], quota={US2[0]: {"v5e": {"spot": 8}}})
    assert wanted_quota_ids(f) == []
    q = effective_quota(f, {}).get(US2[0], SERVING_POOL, SPOT)
    assert (q.chips, q.source, q.region) == (8, QuotaSource.declared, None)


def test_tpuq_fleet_shows_unlimited_not_not_checked():
    from tpuq.operations.fleetreport import precheck_view, target_rows

    f = fleet([{"id": "a", "type": "v4-32", "zones": US2[:1]}])
    quota = effective_quota(f, readings_of(quota_info_body(V4_SPOT, [zone_entry(US2[0], "-1")]),
                                           quota_info_body(V4_SPOT_REGION, [])))
    note = precheck_view(f, Prechecks(quota))["quota"][0]["note"]
    assert note == f"unlimited (Cloud Quotas {V4_SPOT}: -1 (unlimited) in {US2[0]})"
    report = {"backoffs": [], "dropped": [], "queued_resources": []}
    row = target_rows(f, report, datetime(2026, 1, 1, tzinfo=timezone.utc), timezone.utc, quota)[0]
    assert (row["quota_chips"], row["quota_unlimited"], row["quota_source"], row["skipped"]) == \
        (None, True, "Cloud Quotas API", None)


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
        f"http://q/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos/{V4_SPOT_REGION}",
        "http://b/v1/projects/p/billingInfo",
    ]
    assert checks.quota.chips(ZONES[0], "v4", SPOT) is None
    assert checks.billing.enabled is None
    assert checks.problems == [
        f"quota {q}: HTTP 403 PERMISSION_DENIED: Permission 'cloudquotas.quotas.get' denied; using the declared quota"
        for q in (V4_SPOT, V4_SPOT_REGION)
    ] + [
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
    assert len(session.urls) == 3  # the zone ID, the region ID, billing
    cache.get(f, t0 + timedelta(seconds=60))
    assert len(session.urls) == 6
    other = fleet([{"id": "a", "type": "v4-32", "zones": ZONES[:2]}])
    cache.get(other, t0 + timedelta(seconds=61))
    assert len(session.urls) == 9
    session.answers["billingInfo"] = _Response(200, {})
    cache.get(other, t0 + timedelta(seconds=200))
    assert cache.get(other, t0 + timedelta(seconds=201)).billing.disabled
    assert len(session.urls) == 15  # billing off: read again on every message
