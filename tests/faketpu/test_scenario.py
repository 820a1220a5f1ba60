"""Scenario files: validation with clear errors, and pure evaluation."""

from __future__ import annotations

import pytest

from tpuq_dev.capacitymodel.scenario import ScenarioError, Stockout, load_scenario, parse_scenario

EXAMPLE = """
seed: 3
zones:
  us-central2-b:
    quota:
      v4: {spot: 64, on_demand: 32}
    stockouts:
      - {family: v4, start: 100, end: 200}
  europe-west4-a:
    quota:
      v6e: {spot: 8}
delays: {provisioning: 60}
preemption:
  mean_spot_lifetime: 3600
  scripted:
    - {at: 500, zone: us-central2-b}
billing:
  disabled_windows: [{start: 1000, end: 2000}]
"""


def test_example_loads_and_evaluates(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(EXAMPLE)
    s = load_scenario(path)
    assert s.quota_limit("us-central2-b", "v4", "spot") == 64
    assert s.quota_limit("us-central2-b", "v6e", "spot") == 0  # missing entry: no quota
    assert s.quota_limit("asia-east1-c", "v4", "spot") == 0
    assert s.stockout_at("us-central2-b", "v4", 150) is not None
    assert s.stockout_at("us-central2-b", "v4", 200) is None
    assert s.stockout_at("us-central2-b", "v5litepod", 150) is None
    assert s.billing_disabled_at(1500) and not s.billing_disabled_at(2500)
    assert s.stockout_at("us-central2-b", "v4", 150, {("us-central2-b", None): None}) is None
    forced = Stockout(family="v4")
    assert s.stockout_at("us-central2-b", "v4", 0, {("us-central2-b", "v4"): forced}) is forced


def test_unlimited_and_region_quota_evaluate_as_the_cloud_quotas_api_reports_them():
    s = parse_scenario({
        "zones": {"us-central2-a": {"quota": {"v4": {"spot": -1}}}, "us-central2-b": {}, "europe-west4-a": {}},
        "region_quota": {"us-central2": {"v4": {"spot": 32, "on_demand": -1}}},
    })
    assert s.quota_limit("us-central2-a", "v4", "spot") is None  # -1: no limit of its own
    assert s.quota_limit("us-central2-b", "v4", "spot") is None  # no entry: its region's quota alone
    assert s.region_quota_limit("us-central2", "v4", "spot") == 32
    assert s.region_quota_limit("us-central2", "v4", "on_demand") is None  # -1
    assert s.quota_limit("europe-west4-a", "v4", "spot") == 0  # neither: no quota
    assert s.region_quota_limit("europe-west4", "v4", "spot") is None


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"zones": {"nowhere": {}}}, "not a zone name"),
        ({"zones": {"us-central2-b": {"quota": {"v9": {"spot": 1}}}}}, "unknown accelerator family"),
        # -1 is unlimited; below it is refused
        ({"zones": {"us-central2-b": {"quota": {"v4": {"spot": -2}}}}}, "zones.us-central2-b.quota.v4.spot"),
        ({"region_quota": {"us-central2-b": {"v4": {"spot": 8}}}}, "not a region name"),
        ({"zones": {"us-central2-b": {"stockouts": [{"start": 5, "end": 1}]}}}, "must be after its start"),
        ({"preemption": {"scripted": [{"zone": "us-central2-b"}]}}, "exactly one of 'at' or 'after_active'"),
        ({"delays": {"provisionning": 5}}, "delays.provisionning"),
    ],
)
def test_invalid_scenarios_name_the_problem(data, fragment):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    assert fragment in str(e.value)


def test_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("zones: [unclosed")
    with pytest.raises(ScenarioError, match="not YAML"):
        load_scenario(path)
