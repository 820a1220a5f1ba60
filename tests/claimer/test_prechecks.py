"""Quota and billing before queueing: the claimer's handler reads the fake's Cloud Quotas and Cloud Billing
stand-ins, and the fake TPU's call log shows where it created."""

from __future__ import annotations

from tpuq.operations.fleetreport import fleet_report
from tpuq.contracts.messages import CapacityRequest, Tick

from .conftest import fleet_data, scenario_data

ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]


def request(rid="job-1", types=("v4-32",), count=1) -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="race", types=list(types), count=count)


def on_api_quota(**extra) -> dict:
    """The fleet declares no quota: every number comes from the Cloud Quotas API."""
    data = fleet_data(ZONES, **extra)
    data.pop("quota")
    return data



def tpuq_fleet(h):
    """`tpuq fleet` as a person runs it (in this process, on the harness's store and the fake's Google APIs)."""
    return h.tpuq("fleet", "--name", "race")


def test_a_zone_the_quota_api_gives_nothing_is_never_queued_in(claimer):
    scenario = scenario_data(ZONES, provisioning=1e6)
    scenario["zones"][ZONES[1]]["quota"] = {"v4": {"spot": 0}}  # listed with 0: `details: {}`
    scenario["zones"][ZONES[2]]["quota"] = {}  # not listed, no default: no quota either
    h = claimer(scenario)
    h.fleet(on_api_quota())
    h.push("/push/capacity", request())
    for seq in range(2):
        h.push("/push/ticks", Tick(seq=seq))
    assert [len(h.creates(z)) for z in ZONES] == [1, 0, 0]
    reads = [c["path"] for c in h.control.__class__(h.fake.google_apis_url).calls()]
    assert reads[0].endswith("/quotaInfos/TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI")
    assert reads[0].startswith("/v1/projects/tpuq-test/locations/global/services/tpu.googleapis.com/")
    assert "/v1/projects/tpuq-test/billingInfo" in reads
    assert reads[1].endswith("/quotaInfos/TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI")
    # TTL cache: one read of each (zone ID, region ID, billing) for the request and both ticks.
    assert len(reads) == 3


def test_the_quota_is_counted_in_its_unit(claimer):
    """8 chips of v4 spot are 16 TensorCores in the API: less than one v4-32 (16 chips, 32 TensorCores). Read as
    chips, the 16 would let a request in that the TPU API then fails."""
    scenario = scenario_data(ZONES[:2], provisioning=1e6)
    scenario["zones"][ZONES[0]]["quota"] = {"v4": {"spot": 8}}
    h = claimer(scenario)
    h.fleet({**on_api_quota(), "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES[:2], "count": 5}]})
    h.push("/push/capacity", request())
    assert [len(h.creates(z)) for z in ZONES[:2]] == [0, 1]


def test_zones_whose_quota_is_only_their_regions_entry_are_raced_within_it(claimer):
    """The scenario lists no v4 quota for any zone and no default: the per-zone ID covers none of them, and
    us-central2's per-region entry (32 chips: two v4-32) bounds them together. The claimer races two of the three
    zones, and the fake TPU API, which enforces the region's quota, takes both. Before, every zone read as no
    quota and nothing was created."""
    scenario = scenario_data(ZONES, provisioning=1e6, region_quota={"us-central2": {"v4": {"spot": 32}}})
    for z in ZONES:
        scenario["zones"][z]["quota"] = {}
    h = claimer(scenario)
    h.fleet(on_api_quota())
    h.push("/push/capacity", request())
    h.push("/push/ticks", Tick(seq=1))
    assert [len(h.creates(z)) for z in ZONES] == [1, 1, 0]
    states = [h.fake_state(d["name"]) for d in h.qr_docs()]
    assert len(states) == 2 and set(states) <= {"WAITING_FOR_RESOURCES", "PROVISIONING"}, states  # none FAILED


def test_minus_one_is_unlimited_for_the_claimer_and_in_tpuq_fleet(claimer):
    scenario = scenario_data(ZONES[:2], provisioning=1e6)
    scenario["zones"][ZONES[0]]["quota"] = {"v4": {"spot": -1}}
    scenario["zones"][ZONES[1]]["quota"] = {"v4": {"spot": 8}}  # less than one v4-32
    h = claimer(scenario)
    h.fleet({**on_api_quota(), "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES[:2], "count": 5}]})
    h.push("/push/capacity", request())
    assert [len(h.creates(z)) for z in ZONES[:2]] == [1, 0]

    shown = tpuq_fleet(h)
    assert shown.exit_code == 0, shown.output
    assert (f"quota {ZONES[0]} v4-32: unlimited (Cloud Quotas TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI: "
            f"-1 (unlimited) in {ZONES[0]})") in shown.stdout
    assert f"zone {ZONES[0]} v4-32: skipped" not in shown.stdout
    assert f"zone {ZONES[1]} v4-32: skipped: no quota: 8 chips < 16 for one v4-32" in shown.stdout


def test_billing_off_stops_every_create_before_the_first(claimer):
    h = claimer(scenario_data(ZONES, billing={"disabled": True}))
    h.fleet(fleet_data(ZONES))
    h.push("/push/capacity", request())
    h.push("/push/ticks", Tick(seq=1))
    assert h.creates() == []
    report = fleet_report(h.clients.firestore, "race")
    assert report["blocked"].startswith("billing is disabled on project tpuq-test: enable it")
    assert report["blocked_detail"] == "Cloud Billing: billingEnabled false"


def test_a_pre_check_that_fails_never_stops_the_race(claimer):
    scenario = scenario_data(ZONES, provisioning=1e6, cloud_quotas={"permission_denied": True},
                             billing={"permission_denied": True})
    h = claimer(scenario)
    h.fleet(on_api_quota())
    h.push("/push/capacity", request())
    assert [len(h.creates(z)) for z in ZONES] == [1, 1, 1]
    assert fleet_report(h.clients.firestore, "race")["blocked"] is None


def test_an_unknown_quota_id_is_one_line_in_tpuq_fleet_and_the_declared_quota_is_used(claimer):
    quota_id = "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"
    h = claimer(scenario_data(ZONES, provisioning=1e6, cloud_quotas={"unknown_ids": [quota_id]}))
    data = on_api_quota()
    data["quota"] = {ZONES[0]: {"v4": {"spot": 8}}}  # declared: less than one v4-32, so never queued in
    h.fleet(data)
    h.push("/push/capacity", request())
    assert [len(h.creates(z)) for z in ZONES] == [0, 1, 1]  # the others: not checked, raced

    shown = tpuq_fleet(h)
    assert shown.exit_code == 0, shown.output
    problems = [line for line in shown.stdout.splitlines() if line.startswith("pre-check:")]
    assert problems == [f"pre-check: quota {quota_id}: HTTP 404 NOT_FOUND: QuotaInfo 'projects/tpuq-test/locations/"
                        f"global/services/tpu.googleapis.com/quotaInfos/{quota_id}' was not found.; "
                        "using the declared quota"]
    assert f"quota {ZONES[0]} v4-32: 8 chips (declared in the fleet file)" in shown.stdout
    assert f"zone {ZONES[0]} v4-32: skipped: no quota: 8 chips < 16 for one v4-32" in shown.stdout
    assert f"quota {ZONES[1]} v4-32: not checked ({quota_id} unreadable, none declared)" in shown.stdout
    assert "billing: enabled" in shown.stdout
