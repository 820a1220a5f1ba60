"""`tpuq simulate` as a user runs it: a tiny fleet, scenario and workload over a day, on the real engine.

Each run of the engine takes seconds to tens of seconds on a loaded machine: the module runs it three times."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

TINY = Path(__file__).parent / "tiny"
FILES = ["--fleet", str(TINY / "fleet.yaml"), "--scenario", str(TINY / "scenario.yaml"),
         "--workload", str(TINY / "workload.yaml")]
TIMEOUT = 900  # a subprocess on a machine running two suites at once


def tpuq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["tpuq", "simulate", *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, **(env or {})})


def test_a_day_on_the_tiny_fleet_prints_json_and_writes_the_report(tmp_path):
    done = tpuq(*FILES, "--days", "1", "--seed", "3", "--policy", "tpuq", "--policy", "bound", "--json",
                "--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["days"], data["seed"], data["jobs"]) == (1, 3, 6)
    by_policy = {r["policy"]: r for r in data["results"]}
    assert all(n.endswith("not available in this tpuq") for n in data["unavailable"])  # until bound.py lands
    assert set(by_policy) | {"bound" for n in data["unavailable"] if n.startswith("bound")} == {"tpuq", "bound"}
    tpuq_result = by_policy["tpuq"]
    assert tpuq_result["jobs"]["submitted"] == 6 and tpuq_result["jobs"]["finished"] >= 1
    assert tpuq_result["api_calls"]["queuedResources.create"] == sum(tpuq_result["creates_per_zone"].values()) >= 1
    assert set(tpuq_result["creates_per_zone"]) <= {"us-central2-a", "us-central2-b"}
    assert "series" not in tpuq_result
    # What the services' Firestore use would be billed: a figure a day, the probes' writes (not simulated) in it.
    firestore = tpuq_result["firestore"]
    assert firestore["reads_per_day"] == firestore["reads"] > 0 and firestore["writes"] >= firestore["probe_writes"]
    assert all(r["firestore"] is None for r in data["results"] if r["policy"] != "tpuq")
    html = (tmp_path / "report" / "report.html").read_text()
    assert "tpuq" in html and "utilization" in html and "Firestore reads / writes a day" in html
    stored = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert stored[0]["policy"] == "tpuq" and len(stored[0]["series"]["t"]) == 500


def test_compare_runs_the_policy_on_both_fleets_and_prints_the_difference_even_without_matplotlib(tmp_path):
    blocked = tmp_path / "no-matplotlib" / "matplotlib"  # an install without the simulate extra
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    path = os.pathsep.join(filter(None, (str(blocked.parent), os.environ.get("PYTHONPATH"))))
    done = tpuq("--compare", str(TINY / "fleet.yaml"), str(TINY / "fleet-one.yaml"), *FILES[2:], "--days", "1",
                "--json", "--out", str(tmp_path / "report"), env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["fleets"] == ["fleet.yaml", "fleet-one.yaml"]
    (pair,) = data["compare"]
    a, b = pair["results"]
    assert pair["policy"] == a["policy"] == b["policy"] == "tpuq"
    assert pair["difference"]["jobs_finished"] == b["jobs"]["finished"] - a["jobs"]["finished"]
    assert a["jobs"]["submitted"] == b["jobs"]["submitted"] == 6  # the same workload and seed on both
    # one small slice at a time, in one zone: fleet-one never creates in us-central2-a
    assert "us-central2-a" not in b["creates_per_zone"]
    assert "pip install 'tpuq[simulate]'" in done.stderr
    html = (tmp_path / "report" / "report.html").read_text()
    assert "tpuq (fleet.yaml)" in html and "tpuq (fleet-one.yaml)" in html and "tpuq[simulate]" in html
    assert not list((tmp_path / "report").glob("*.png"))


def test_the_table_names_the_report_by_a_link_that_opens_from_anywhere(tmp_path):
    done = subprocess.run(["tpuq", "simulate", *FILES, "--days", "0.5", "--policy", "bound", "--out", "report"],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wait p50" in done.stdout
    assert ", 0.5 days, seed" in done.stdout
    assert done.stdout.splitlines()[-1] == f"report: {(tmp_path / 'report' / 'report.html').as_uri()}"


def write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    fleet = yaml.safe_load((TINY / "fleet.yaml").read_text())
    workload = yaml.safe_load((TINY / "workload.yaml").read_text())
    scenario = str(TINY / "scenario.yaml")
    other_zone = write(tmp / "zone.yaml", {**fleet, "tpus": [{"id": "x", "type": "v4-8", "zones": ["us-east5-b"]}]})
    no_quota = write(tmp / "family.yaml", {**fleet, "tpus": [{"id": "x", "type": "v6e-8", "zones": ["us-central2-b"]}]})
    too_big = write(tmp / "big.yaml", {**fleet, "tpus": [{"id": "x", "type": "v4-64", "zones": ["us-central2-a"]}]})
    sigma = write(tmp / "sigma.yaml", {**workload, "duration": {"dist": "lognormal", "median": 60, "sigma": -1}})
    unknown = write(tmp / "unknown.yaml", {**workload, "jobz": 3})
    unoffered = write(tmp / "unoffered.yaml", {**workload, "types": [{"tpu": "v5e-8", "weight": 1}]})
    not_yaml = write(tmp / "not-yaml.yaml", "jobs: [\n")
    bad_scenario = write(tmp / "scenario.yaml", "zones:\n  us-central2-b:\n    quota: {v4: {spot: -2}}\n")
    scenario_not_yaml = write(tmp / "scenario-not-yaml.yaml", "zones:\n  us-central2-b: {quota: {v4: {spot: 8}}\n")
    binary = tmp / "binary.yaml"
    binary.write_bytes(b"\xd0\xff\x00 not text")
    elsewhere = write(tmp / "elsewhere.yaml", {**workload, "types": [{"tpu": "v4-8", "regions": ["europe-west4"]}]})
    late = write(tmp / "late.yaml", {**workload, "arrivals": {"bursts": [{"at_hours": 30, "count": 6}]}})
    a_file = write(tmp / "a-file", "")
    adopted = write(tmp / "adopted.yaml", {**fleet, "tpus": [
        {"id": "mine", "type": "v4-8", "zone": "us-central2-b", "existing": "my-node"},
        {"id": "pod", "type": "v4-32", "zones": ["us-central2-b"]}]})
    small = write(tmp / "small.yaml", {**workload, "types": [{"tpu": "v4-8"}]})
    zones = "zones:\n  us-central2-b: {quota: {v4: {spot: 32}}}\n  us-central2-a: {quota: {v4: {spot: 8}}}\n"
    fraction = write(tmp / "fraction.yaml", zones.replace("}}}\n  us-central2-a", "}},\n    stockout_model: "
                                                          "{v4: {fraction: 1.5, mean_window: 60}}}\n  us-central2-a"))
    gamma = write(tmp / "gamma.yaml", zones + "delays: {provisioning: {dist: gamma, k: 3}}\n")
    second = write(tmp / "second.yaml", zones + "preemption: {lifetimes: [{family: v4, mean: 60}, {family: v4}]}\n")
    files = lambda f=str(TINY / "fleet.yaml"), s=scenario, w=str(TINY / "workload.yaml"): [  # noqa: E731
        "--fleet", str(f), "--scenario", str(s), "--workload", str(w)]
    return [
        (files(f=other_zone), "fleet tpus[0] (x): zone us-east5-b is not in the scenario (its zones: us-central2-a, "
                              "us-central2-b)"),
        (files(f=no_quota), "fleet tpus[0] (x): the scenario offers 0 spot v6e chips in us-central2-b, less than "
                            "one v6e-8 slice (8 chips)"),
        (files(f=too_big), "fleet tpus[0] (x): the scenario offers 8 spot v4 chips in us-central2-a, less than one "
                           "v4-64 slice (32 chips)"),
        (files(w=sigma), f"{sigma}: workload.duration.sigma: must be > 0"),
        (files(w=unknown), f"{unknown}: workload.jobz: unknown field"),
        (files(w=unoffered), "workload: job job-00000 wants v5litepod-8, which no fleet entry offers (the fleet's "
                             "types: v4-32, v4-8)"),
        (files(s=bad_scenario), f"scenario {bad_scenario}: zones.us-central2-b.quota.v4.spot: must be >= -1"),
        (files(w=not_yaml), f"workload {not_yaml}: not valid YAML at line 2"),
        (files(w=tmp / "missing.yaml"), f"workload {tmp / 'missing.yaml'}: no such file"),
        (files(f=TINY / "workload.yaml"), f"fleet {TINY / 'workload.yaml'}: invalid fleet file: name: is required"),
        (files(f=tmp / "missing.yaml"), f"fleet {tmp / 'missing.yaml'}: no such file"),
        (files(s=scenario_not_yaml), f"scenario {scenario_not_yaml}: not valid YAML at line 3, column 1: "),
        (files(s=binary), f"scenario {binary}: not a text file"),
        (files(s=fraction), f"scenario {fraction}: zones.us-central2-b.stockout_model.v4.fraction: must be < 1"),
        (files(s=gamma), f"scenario {gamma}: delays.provisioning.dist: 'gamma' is not one of fixed, uniform, "
                         "exponential, lognormal"),
        (files(s=second), f"scenario {second}: preemption.lifetimes[1].mean: is required"),
        (files(w=binary), f"workload {binary}: not a text file"),
        (files(w=tmp), f"workload {tmp}: is a directory"),
        (files(w=elsewhere), "workload: job job-00000 wants v4-8 in europe-west4, which no fleet entry offers (the "
                             "fleet's: v4-32 in us-central2, v4-8 in us-central2)"),
        (files(f=adopted, w=small), "workload: job job-00000 wants v4-8, which no fleet entry offers (the fleet's "
                                    "types: v4-32; the simulated cloud has no existing: node)"),
        ([*files(w=late), "--days", "1"], f"workload {late}: no job is submitted within --days 1"),
        ([*files(), "--days", "0.1", "--out", str(a_file)], f"--out {a_file}: cannot write the report there: "),
        (["--compare", str(TINY / "fleet.yaml"), *files()[2:]],
         "--compare: takes two fleet files (FLEET1 FLEET2), got '--scenario' as the second"),
        (files()[:4], "--workload is required (or --example for the standard scenario's files)"),
        ([*files(), "--policy", "fifo"], "--policy: unknown policy 'fifo'; expected one of tpuq, polling, bound"),
        ([*files(), "--days", "-1"], "--days: must be > 0 and at most 3650, got -1"),
        (["--compare", str(TINY / "fleet.yaml"), str(other_zone), *files()[2:]],
         "fleet tpus[0] (x): zone us-east5-b is not in the scenario (its zones: us-central2-a, us-central2-b)"),
    ]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    """Each bad input through the CLI's entry function, in this process (one import of the simulator, not one per
    case); the first and the last case also as a process, for its exit status and streams."""
    from tpuq.cli import main

    cases = bad_inputs(tmp_path)
    for args, message in cases:
        code = main(["simulate", *args])
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert (code, len(lines), out) == (2, 1, ""), (args, err)
        assert lines[0].startswith(f"error: {message}"), (lines[0], message)
        assert "Traceback" not in err
    for args, message in (cases[0], cases[-1]):
        done = tpuq(*args)
        lines = done.stderr.strip().splitlines()
        assert (done.returncode, len(lines), done.stdout) == (2, 1, ""), (args, done.stderr)
        assert lines[0].startswith(f"error: {message}"), (lines[0], message)
        assert "Traceback" not in done.stderr


def test_the_standard_scenarios_files_ship_in_the_package_and_agree():
    from tpuq_dev.capacitymodel.scenario import ZoneScenario
    from tpuq_dev.simulate_cli import EXAMPLE_FILES, EXAMPLES, _load_fleet, _load_jobs, check_jobs_against_fleet, read_inputs
    from tpuq_dev.simulate.workload import load_workload
    from tpuq.contracts.tputypes import parse_accelerator_type

    paths = {kind: EXAMPLES / name for kind, name in EXAMPLE_FILES.items()}
    fleet = _load_fleet(paths["fleet"])
    jobs = _load_jobs(paths["workload"], seed=0, horizon=30 * 86400.0)
    assert len(jobs) == 2000
    multi = sum(any(parse_accelerator_type(t).hosts > 1 for t in j.types) for j in jobs)
    assert 0.17 < multi / 2000 < 0.23  # 20% multi-host
    assert {j.priority for j in jobs} == {"high", "normal", "low"}
    check_jobs_against_fleet(jobs, fleet)
    spot_zones = {z for e in fleet.tpus if e.accelerator.family == "v4" and e.spot for z in e.zones}
    assert len(spot_zones) == 3 and load_workload(paths["workload"]).checkpoint_every
    if "stockout_model" not in ZoneScenario.model_fields:
        pytest.skip("the scenario's stochastic fields (stockout_model, lifetimes, delay distributions) have not landed")
    inputs = read_inputs(paths["fleet"], paths["scenario"], paths["workload"], seed=0, horizon=30 * 86400.0)
    assert set(inputs.scenario.zones) == {z for e in fleet.tpus for z in e.zones}  # and each has quota for it


@pytest.mark.parametrize("extra, notes", [
    ({}, []),
    ({"grant_expires": "2026-12-31"}, []),  # after a 30-day run from the simulated start (2026-01-05)
    ({"grant_expires": "2026-01-20"}, ["the fleet's grant_expires (2026-01-20) comes before the run ends (it runs "
                                       "2026-01-05 to 2026-02-04): the tpuq policy claims nothing after it; polling "
                                       "and bound ignore it"]),
    ({"budget": {"vm_hours_per_day": 50}}, ["the fleet's budget (50 VM-hours a day) brakes the tpuq policy only"]),
])
def test_a_brake_only_the_tpuq_policy_honours_is_noted(extra, notes):
    """A real fleet file's brakes stop tpuq's claims but not polling's or the bound's: the user is told why."""
    from tpuq_dev.simulate_cli import _load_fleet, brake_notes
    from tpuq.contracts.fleet import FleetFile

    fleet = _load_fleet(TINY / "fleet.yaml")
    fleet = FleetFile.model_validate({**fleet.model_dump(exclude_none=True), **extra})
    assert brake_notes(fleet, 30 * 86400.0, ["tpuq", "polling", "bound"]) == notes
    assert brake_notes(fleet, 30 * 86400.0, ["polling", "bound"]) == []


def test_a_run_of_one_day_is_called_one_day():
    from tpuq_dev.simulate_cli import _days

    assert (_days(1), _days(1.5), _days(30)) == ("1 day", "1.5 days", "30 days")
