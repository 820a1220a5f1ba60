"""One TPU catalogue (`tpuq.contracts.tputypes.FAMILIES`): a new family is one row there, and no other module spells a
family's facts (issue 33 §4)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from tests.layout import production_modules
from tpuq.contracts import tputypes
from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.errors import quota_error, region_quota_error
from tpuq_dev.capacitymodel.model import FakeTpuWorld, QrState
from tpuq_dev.capacitymodel.render import quota_ids, render_node, render_quota_info
from tpuq_dev.capacitymodel.scenario import parse_scenario
from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.capacity.quota import QUOTA_FACTS, QuotaReading, QuotaSource, effective_quota, parse_quota_info, quota_pool, \
    wanted_quota_ids
from tpuq.contracts.tputypes import Family, QuotaIds, QuotaUnit, UnknownAcceleratorType, parse_accelerator_type

ROOT = Path(__file__).resolve().parents[2]
SPOT, ON_DEMAND = ProvisioningModel.spot, ProvisioningModel.on_demand
ZONE, PROJECT = "us-central2-b", "proj"

# A family no Google TPU has: chips-counted, single-host sizes 1/4/8, a spot quota on record (zone and region),
# an on-demand one only the fake names, a serving pool for its single-host slices, single-slot by default.
V9T = Family(
    "v9t", "V9T", QuotaUnit.chips, "v2-alpha-tpuv9t", aliases=("v9",), single_host_sizes=(1, 4, 8),
    single_slot=True, quota={
        SPOT: QuotaIds("TPUV9TPreemptiblePerProjectPerZoneForTPUAPI", "TPUV9TPreemptiblePerProjectPerRegionForTPUAPI"),
        ON_DEMAND: QuotaIds("TPUV9TPerProjectPerZoneForTPUAPI", "TPUV9TPerProjectPerRegionForTPUAPI",
                            on_record=False)},
    serving_quota={SPOT: QuotaIds("TPUV9TPreemptibleServingPerProjectPerZoneForTPUAPI")})


@pytest.fixture
def new_family(monkeypatch):
    """The one edit a new family takes: its row in the catalogue."""
    monkeypatch.setattr(tputypes, "FAMILIES", (*tputypes.FAMILIES, V9T))


def fleet(**extra) -> FleetFile:
    return FleetFile.model_validate({
        "name": "f", "project": PROJECT,
        "tpus": [{"id": "big", "type": "v9-16", "zones": [ZONE]},
                 {"id": "small", "type": "v9t-4", "zones": [ZONE]},
                 {"id": "od", "type": "v9t-32", "zones": [ZONE], "provisioning_model": "on_demand",
                  "single_slot": False}],
        **extra})


def test_a_new_family_is_one_row_for_the_fleet_file(new_family):
    f = fleet(quota={ZONE: {"v9": {"spot": 16}}})
    big, small, od = f.tpus
    assert (big.type, big.accelerator.chips, big.accelerator.hosts) == ("v9t-16", 16, 4)
    assert (small.accelerator.hosts, big.runtime_version, big.accelerator.generation) == (1, "v2-alpha-tpuv9t", "V9T")
    assert big.is_single_slot and not od.is_single_slot
    assert f.declared_quota_chips(ZONE, "v9t", SPOT) == 16  # the alias keys the quota block too
    with pytest.raises(UnknownAcceleratorType, match="single-host v9t sizes are 1, 4 or 8"):
        parse_accelerator_type("v9-2")
    with pytest.raises(ValueError, match=r"unknown TPU family \(expected v2, v3, v4, v5p, v5e, v6e, v9\)"):
        fleet(quota={ZONE: {"v10": {"spot": 8}}})


def test_a_new_family_is_one_row_for_the_quota_prechecks(new_family):
    f = fleet()
    zone_id, region_id = "TPUV9TPreemptiblePerProjectPerZoneForTPUAPI", "TPUV9TPreemptiblePerProjectPerRegionForTPUAPI"
    serving_id = "TPUV9TPreemptibleServingPerProjectPerZoneForTPUAPI"
    assert (quota_pool("v9t-16"), quota_pool("v9t-4")) == ("v9t", "v9t-serving")
    assert [q.quota_id for q in QUOTA_FACTS[("v9t", SPOT)]] == [zone_id, region_id]
    assert ("v9t", ON_DEMAND) not in QUOTA_FACTS  # off the record: declared in the fleet file
    assert wanted_quota_ids(f) == [zone_id, region_id, serving_id]
    readings = {qid: QuotaReading(qid, parse_quota_info({"dimensionsInfos": [
        {"dimensions": {"zone": ZONE}, "details": {"value": "32"}}]})) for qid in (zone_id, serving_id)}
    readings[region_id] = QuotaReading(region_id, error="HTTP 403")
    quota = effective_quota(f, readings)
    big = quota.get(ZONE, "v9t", SPOT)
    assert (big.chips, big.source) == (32, QuotaSource.api) and zone_id in big.detail
    assert quota.get(ZONE, "v9t-serving", SPOT).chips == 32
    od = quota.get(ZONE, "v9t", ON_DEMAND)
    assert od.source is QuotaSource.fallback and "no Cloud Quotas ID known for v9t on-demand" in od.detail
    assert quota.problems == (f"quota {region_id}: HTTP 403; using the declared quota",)


def test_a_new_family_is_one_row_for_the_capacity_model(new_family):
    assert "Quota limit 'TPUV9TPreemptiblePerProjectPerZoneForTPUAPI' has been exceeded" in \
        quota_error(ZONE, "v9t", True, 0).message
    assert "'TPUV9TPerProjectPerRegionForTPUAPI'" in region_quota_error("us-central2", "v9t", False, 0).message
    ids = quota_ids()
    assert ids["TPUV9TPreemptiblePerProjectPerZoneForTPUAPI"] == ("v9t", "spot", "zone")
    assert ids["TPUV9TPerProjectPerRegionForTPUAPI"] == ("v9t", "on_demand", "region")
    assert ids["TPUV9TPreemptibleServingPerProjectPerZoneForTPUAPI"] == ("v9t", "spot", "zone")

    scenario = parse_scenario({"zones": {ZONE: {"quota": {"v9t": {"spot": 16}}}},
                               "delays": {"accepted": 1, "waiting": 1, "provisioning": 1}})
    clock = ManualClock()
    world = FakeTpuWorld(scenario, clock, random.Random(7))
    info = render_quota_info(world, PROJECT, "TPUV9TPreemptiblePerProjectPerZoneForTPUAPI")
    assert info["dimensionsInfos"][0] == {"dimensions": {"zone": ZONE}, "details": {"value": "16"},
                                          "applicableLocations": [ZONE]}

    def create(qr_id: str, accelerator: str) -> None:
        node = {"acceleratorType": accelerator, "runtimeVersion": "v2-alpha-tpuv9t"}
        world.create_queued_resource(PROJECT, ZONE, qr_id, {"tpu": {"nodeSpec": [
            {"parent": f"projects/{PROJECT}/locations/{ZONE}", "nodeId": qr_id, "node": node}]}, "spot": {}}, None)

    create("won", "v9-16")
    create("over", "v9t-4")  # 16 + 4 chips > the zone's 16
    clock.advance(5)
    assert world.get_queued_resource(PROJECT, ZONE, "won").state == QrState.ACTIVE
    over = world.get_queued_resource(PROJECT, ZONE, "over")
    assert over.state == QrState.FAILED and "TPUV9TPreemptiblePerProjectPerZoneForTPUAPI" in \
        over.failed_error.message
    node = render_node(world, world.get_node(PROJECT, ZONE, "won"))
    assert node["acceleratorType"] == "v9t-16"
    assert node["acceleratorConfig"] == {"type": "V9T", "topology": "4x4"}
    assert len(node["networkEndpoints"]) == 4


# ---------------------------------------------------------------- no family fact outside the catalogue

CATALOGUE = "shared/contracts/tputypes.py"
# (file, literal) -> why that literal is not a family fact.
ALLOWED = {
    ("dev/tpuq_dev/capacitymodel/model.py", "v2"): "the TPU API's version (tpu.googleapis.com/v2), not the v2 family",
    ("dev/tpuq_dev/simulate/cloud.py", "v2"): "the TPU API's version",
    ("dev/tpuq_dev/faketpu/api.py", "v2"): "the TPU API's versions the fake serves",
    ("dev/tpuq_dev/capacitymodel/multislice.py", "v2"): "the TPU API's version, whose message is multisliceParams",
    ("dev/tpuq_dev/capacitymodel/render.py", "v2"): "the TPU API's version a queued resource is rendered for",
    ("dev/tpuq_dev/capacitymodel/validation.py", "v2"): "the TPU API's version a create body is parsed for",
    ("dev/tpuq_dev/capacitymodel/render.py", "V2"): "a node's apiVersion, not the V2 generation",
    ("dev/tpuq_dev/capacitymodel/model.py", "v4"): "a synchronous refusal injected on a zone is about no type: the "
                                               "fake names v4 spot's quota in it",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _is_family_fact(text: str) -> bool:
    """A family's name or alias ("v5litepod", "v5e"), a generation label ("V5LITE_POD"), a quota ID ("TPUV..."),
    or a family-named string that is not a type name ("v5litepod-serving", "v2-alpha-tpuv5"). Type names such as
    "v4-8" are examples and defaults, not facts about the family."""
    names = {n for f in tputypes.FAMILIES for n in (f.name, *f.aliases)}
    if text.lower() in names or text in {f.generation for f in tputypes.FAMILIES} or "TPUV" in text:
        return True
    return any(text.lower().startswith(f"{n}-") and not text[len(n) + 1:].isdigit() for n in names)


def test_no_module_but_the_catalogue_spells_a_family_fact():
    """String literals only (docstrings and comments cite and explain; they decide nothing)."""
    found = []
    for path in sorted([*production_modules().values(), *(ROOT / "dev" / "tpuq_dev").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel == CATALOGUE:
            continue
        tree = ast.parse(path.read_text(), rel)
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and _is_family_fact(node.value) and (rel, node.value) not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "family facts belong in one row of tpuq.contracts.tputypes.FAMILIES:\n" + "\n".join(found)


def test_the_scan_sees_what_it_looks_for():
    assert _is_family_fact("v5litepod") and _is_family_fact("V5LITE_POD") and _is_family_fact("v5e")
    assert _is_family_fact("TPUV4sPodPerProjectPerZoneForTPUAPI") and _is_family_fact("v5litepod-serving")
    assert _is_family_fact("v2-alpha-tpuv5-lite")
    assert not _is_family_fact("v4-8") and not _is_family_fact("v5litepod-64") and not _is_family_fact("v2alpha1")


def test_every_quota_id_names_one_pool_and_tier():
    ids = [(ids.zone, ids.region) for f in tputypes.FAMILIES for by_tier in (f.quota, f.serving_quota)
           for ids in by_tier.values()]
    flat = [i for pair in ids for i in pair if i]
    assert len(flat) == len(set(flat))
    assert all(set(f.quota) == set(ProvisioningModel) for f in tputypes.FAMILIES)
