"""The scenario's stochastic parts: stockout windows per zone and family, spot lifetimes per zone and family,
delay distributions. Each draw depends only on the seed and what it is about, never on call order."""

from __future__ import annotations

import random
import statistics

import pytest

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.model import FakeTpuWorld, QrState
from tpuq_dev.capacitymodel.scenario import ScenarioError, parse_scenario, stockout_windows

P, Z, Z2 = "proj", "us-central2-b", "europe-west4-a"
DAY = 86400


def scenario(**extra):
    data = {"seed": 11, "zones": {Z: {"quota": {"v4": {"spot": 10_000}}}, Z2: {"quota": {"v4": {"spot": 10_000}}}},
            "delays": {"accepted": 1, "waiting": 5, "provisioning": 100, "deleting": 5}}
    for key, value in extra.items():
        if key == "zone":
            data["zones"][Z].update(value)
        else:
            data[key] = value
    return parse_scenario(data)


def body(node_id: str, zone=Z) -> dict:
    return {"tpu": {"nodeSpec": [{"parent": f"projects/{P}/locations/{zone}", "nodeId": node_id,
                                  "node": {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}}]},
            "spot": {}}


def world(s):
    seen = []
    clock = ManualClock()
    return FakeTpuWorld(s, clock, random.Random(0), on_transition=seen.append), clock, seen


def run_until(w, clock, until):
    while (due := w.next_due()) is not None and due <= until:
        clock.advance(due - clock.now())
        w.advance()
    clock.advance(until - clock.now())
    w.advance()


STOCKOUT = {"stockout_model": {"v4": {"fraction": 0.3, "mean_window": 7200, "effect": "fail"}}}


@pytest.mark.parametrize("extra, fragment", [
    ({"zone": {"stockout_model": {"v4": {"fraction": 1.0, "mean_window": 60}}}},
     "zones.us-central2-b.stockout_model.v4.fraction: Input should be less than 1"),
    ({"zone": {"stockout_model": {"v4": {"fraction": -0.1, "mean_window": 60}}}}, "stockout_model.v4.fraction"),
    ({"zone": {"stockout_model": {"v4": {"fraction": 0.1, "mean_window": 0}}}}, "stockout_model.v4.mean_window"),
    ({"zone": {"stockout_model": {"v9": {"fraction": 0.1, "mean_window": 60}}}}, "unknown accelerator family 'v9'"),
    ({"zone": {"stockout_model": {"v4": {"fraction": 0.1, "mean_window": 60, "effect": "later"}}}},
     "stockout_model.v4.effect"),
    ({"preemption": {"lifetimes": [{"zone": Z, "mean": -5}]}}, "preemption.lifetimes.0.mean: Input should be greater than 0"),
    ({"preemption": {"lifetimes": [{"family": "v4", "mean": 5}, {"family": "v4", "mean": 6}]}},
     "two lifetimes for zone any, family v4"),
    ({"delays": {"provisioning": {"dist": "gamma", "mean": 5}}}, "delays.provisioning: Input tag 'gamma'"),
    ({"delays": {"provisioning": {"dist": "uniform", "low": 900, "high": 300}}},
     "low (900.0) must not be above high (300.0)"),
    ({"delays": {"provisioning": {"dist": "exponential", "mean": -1}}}, "delays.provisioning.exponential.mean"),
    ({"delays": {"provisioning": {"dist": "lognormal", "median": 600}}}, "delays.provisioning.lognormal.sigma: Field required"),
    ({"delays": {"provisioning": {"dist": "lognormal", "median": 600, "sigma": 0.5, "mean": 3}}},
     "delays.provisioning.lognormal.mean: Extra inputs are not permitted"),
    ({"delays": {"waiting": -3}}, "delays.waiting: Value error, a delay must be 0 or more seconds, got -3"),
    ({"delays": {"provisioning": "fast"}}, "delays.provisioning: Value error, expected a number of seconds or {dist:"),
    ({"delays": {"provisioning": {"median": 600}}}, "delays.provisioning: Value error, a distribution needs dist: one of"),
    ({"preemption": {"lifetimes": [{"zone": "nowhere", "mean": 5}]}}, "preemption.lifetimes.0.zone: Value error, not a zone"),
    ({"zone": {"provisioning": {"v4": {"dist": "fixed"}}}}, "zones.us-central2-b.provisioning.v4.fixed.value"),
])
def test_a_bad_stochastic_field_is_one_line_naming_it(extra, fragment):
    with pytest.raises(ScenarioError) as e:
        scenario(**extra)
    header, *problems = str(e.value).splitlines()
    assert len(problems) == 1, str(e.value)
    assert fragment in problems[0]


def test_stockout_windows_are_a_pure_function_of_seed_zone_and_family():
    s = scenario(zone=STOCKOUT)
    full = stockout_windows(s, Z, "v4", 30 * DAY)
    # Another scenario object, asked piecemeal and after other zones: the same windows.
    other = scenario(zone=STOCKOUT)
    other.stockout_at(Z2, "v4", 5 * DAY)
    for t in range(0, 30 * DAY, 3 * 3600):
        other.stockout_at(Z, "v4", t)
    assert stockout_windows(other, Z, "v4", 30 * DAY) == full
    assert all(w.effect == "fail" and w.family == "v4" for w in full)
    assert all(a.end < b.start for a, b in zip(full, full[1:]))  # alternating: an in-stock gap between windows
    assert stockout_windows(s, Z2, "v4", 30 * DAY) == []  # no model there
    # A copy with another seed (`--seed K`) draws its own; the original keeps its windows.
    reseeded = s.model_copy(update={"seed": 12})
    twelve = stockout_windows(scenario(seed=12, zone=STOCKOUT), Z, "v4", 30 * DAY)
    assert stockout_windows(reseeded, Z, "v4", 30 * DAY) == twelve != full
    assert stockout_windows(s, Z, "v4", 30 * DAY) == full
    rezoned = s.model_copy(update={"zones": {Z: s.zones[Z].model_copy(
        update={"stockout_model": {"v4": s.zones[Z].stockout_model["v4"].model_copy(update={"fraction": 0.6})}})}})
    assert stockout_windows(rezoned, Z, "v4", 30 * DAY) != full
    assert stockout_windows(s, Z, "v4", 30 * DAY) == full


def test_stockout_windows_have_the_fraction_and_mean_length_asked():
    s = scenario(zone=STOCKOUT)
    horizon = 90 * DAY
    windows = stockout_windows(s, Z, "v4", horizon)
    out = sum(min(w.end, horizon) - w.start for w in windows)
    assert 0.25 < out / horizon < 0.35
    assert 0.8 * 7200 < statistics.mean(w.end - w.start for w in windows) < 1.2 * 7200
    # The model's lookups agree with the list.
    for w in windows[:20]:
        assert s.stockout_at(Z, "v4", w.start) == w and s.stockout_at(Z, "v4", (w.start + w.end) / 2) == w
        assert s.stockout_at(Z, "v4", w.end) is None


def test_a_scripted_window_and_an_override_win_over_the_generated_ones():
    s = scenario(zone={**STOCKOUT, "stockouts": [{"start": 0, "end": 10 * DAY, "effect": "wait"}]})
    generated = stockout_windows(s, Z, "v4", 20 * DAY, scripted=False)
    assert stockout_windows(s, Z, "v4", 20 * DAY) == [s.zones[Z].stockouts[0], *generated]
    assert s.stockout_at(Z, "v4", 5).effect == "wait"
    late = next(w for w in generated if w.start > 10 * DAY)
    assert s.stockout_at(Z, "v4", late.start) == late
    assert s.stockout_at(Z, "v4", late.start, {(Z, None): None}) is None


def test_the_model_fails_a_request_whose_capacity_check_lands_in_a_generated_window():
    s = scenario(zone=STOCKOUT)
    windows = stockout_windows(s, Z, "v4", 30 * DAY)
    inside = next(w for w in windows if w.end - w.start > 60)
    gap_start = next(a.end for a, b in zip(windows, windows[1:]) if b.start - a.end > 60)
    w, clock, _ = world(s)
    for qr_id, check_at in (("in", inside.start + 1), ("out", gap_start + 1)):
        clock.advance(check_at - 6 - clock.now())  # accepted 1 + waiting 5: the check comes 6 s after create
        w.create_queued_resource(P, Z, qr_id, body(f"n-{qr_id}"), None)
        run_until(w, clock, check_at)
    assert w.get_queued_resource(P, Z, "in").state == QrState.FAILED
    assert "no more capacity" in w.get_queued_resource(P, Z, "in").failed_error.message
    assert w.get_queued_resource(P, Z, "out").state == QrState.PROVISIONING


def test_a_waiting_request_provisions_the_instant_a_generated_wait_window_ends():
    s = scenario(zone={"stockout_model": {"v4": {"fraction": 0.5, "mean_window": 3600, "effect": "wait"}}})
    window = next(w for w in stockout_windows(s, Z, "v4", 30 * DAY) if w.end - w.start > 60)
    w, clock, seen = world(s)
    clock.advance(window.start + 1 - 6)
    w.create_queued_resource(P, Z, "q", body("n"), None)
    assert w.next_due() == window.start + 1 - 5  # its quota check
    run_until(w, clock, window.start + 2)
    assert w.next_due() == window.end  # nothing between: the window's edge is the next thing that happens
    clock.advance(window.end + 50_000 - clock.now())
    w.advance()
    [prov] = [t for t in seen if t.state == QrState.PROVISIONING]
    assert prov.at == window.end


@pytest.mark.parametrize("zone, family, mean", [
    (Z, "v4", 100), (Z, "v5litepod", 200), (Z2, "v4", 300), (Z2, "v6e", 400), ("us-east1-d", "v6e", 400),
])
def test_the_most_specific_lifetime_wins_then_the_global_mean(zone, family, mean):
    s = scenario(preemption={"mean_spot_lifetime": 400, "lifetimes": [
        {"zone": Z, "family": "v4", "mean": 100}, {"zone": Z, "mean": 200}, {"family": "v4", "mean": 300}]})
    assert s.preemption.mean_lifetime(zone, family) == mean


def test_a_node_s_lifetime_is_drawn_from_its_name_whatever_else_happened():
    s = scenario(preemption={"lifetimes": [{"zone": Z, "family": "v4", "mean": 7200}]})
    ends = []
    for others in (0, 7):
        w, clock, seen = world(s)
        for i in range(others):
            w.create_queued_resource(P, Z, f"other{i}", body(f"o{i}"), None)
            clock.advance(13)
        w.create_queued_resource(P, Z, "q", body("n"), None)
        clock.advance(100 * DAY)
        w.advance()
        ready = next(t for t in seen if t.name.endswith("/nodes/n") and t.state and t.state.value == "READY")
        preempted = next(t for t in seen if t.name.endswith("/nodes/n") and t.state and t.state.value == "PREEMPTED")
        ends.append(preempted.at - ready.at)
    node = f"projects/{P}/locations/{Z}/nodes/n"
    assert ends[0] == ends[1] == s.spot_lifetime(Z, "v4", node)
    assert s.spot_lifetime(Z2, "v4", node) is None  # no lifetime there, no global mean: never preempted


def test_provisioning_delays_are_drawn_per_request_from_its_name_with_zone_overrides():
    s = scenario(delays={"provisioning": {"dist": "lognormal", "median": 600, "sigma": 0.5}},
                 zone={"provisioning": {"v4": {"dist": "uniform", "low": 300, "high": 900}}})
    w, clock, seen = world(s)
    for zone in (Z, Z2):
        for i in range(3):
            w.create_queued_resource(P, zone, f"q{i}", body(f"n{i}", zone), None)
    clock.advance(DAY)
    w.advance()
    for zone in (Z, Z2):
        for i in range(3):
            name = f"projects/{P}/locations/{zone}/queuedResources/q{i}"
            prov, active = (next(t.at for t in seen if t.name == name and t.state == state)
                            for state in (QrState.PROVISIONING, QrState.ACTIVE))
            assert active - prov == pytest.approx(s.provisioning_delay(zone, "v4", name))
            if zone == Z:
                assert 300 <= active - prov <= 900
    draws = [s.provisioning_delay(Z2, "v4", f"qr-{i}") for i in range(2000)]
    assert 540 < statistics.median(draws) < 660
    assert len(set(draws)) == 2000


def test_a_number_is_still_a_fixed_delay():
    s = scenario(delays={"provisioning": 60, "waiting": 7})
    assert s.provisioning_delay(Z, "v4", "any") == 60 and s.waiting_delay(Z, "v4", "any") == 7
    assert s.delays.provisioning.typical == 60
