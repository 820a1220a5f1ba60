"""The Cost page's arithmetic (tpuq.ui.cost, pure): billed VM-hours against those of attempts, per UTC day and
type, and the waste by cause; and the janitor's surplus reason it recognises race losers by."""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.ui.cost import SURPLUS_REASON, chart_data, cost_rows, split_by_day, totals

T0 = datetime(2026, 12, 1, 22, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)


def tpu(short, created, gone=None, tpu_type="v4-8", **extra):
    doc = {"short": short, "name": f"projects/p/locations/z/nodes/{short}", "type": tpu_type, "created_at": created,
           "state": "gone" if gone else "idle", **extra}
    if gone:
        doc["gone_at"] = gone
    return doc


def attempt(node, started, ended=None, outcome=None, n=1):
    return {"attempt": n, "state": "ended" if ended else "running", "tpu": f"projects/p/locations/z/nodes/{node}",
            "started_at": started, "ended_at": ended, "outcome": outcome}


def test_split_by_day_cuts_at_midnight_utc():
    assert split_by_day(T0, T0 + 3 * H) == [("2026-12-01", 2.0), ("2026-12-02", 1.0)]


@pytest.mark.parametrize("tpus, attempts, billed, running, waste", [
    # a v4-8 (1 host) alive 4 h, a job on it for 1 h: 3 h idle
    ([tpu("a", T0, T0 + 4 * H)], [attempt("a", T0 + H, T0 + 2 * H, "succeeded")], 4, 1,
     {"idle": 3, "race losers": 0, "lost to preemption": 0}),
    # a v4-32 (4 hosts) alive 1 h, preempted after 30 min: 2 VM-hours lost, 2 idle
    ([tpu("b", T0, T0 + H, "v4-32")], [attempt("b", T0, T0 + H / 2, "preempted")], 4, 2,
     {"idle": 2, "race losers": 0, "lost to preemption": 2}),
    # a race loser that reached ACTIVE and was deleted unused 30 min later
    ([tpu("c", T0, T0 + H / 2, delete_reason=f"{SURPLUS_REASON}: its race was already won")], [], 0.5, 0,
     {"idle": 0, "race losers": 0.5, "lost to preemption": 0}),
    # alive still: counted until now; an attempt on a TPU tpuq never recorded is left out
    ([tpu("d", T0)], [attempt("elsewhere", T0)], 6, 0, {"idle": 6, "race losers": 0, "lost to preemption": 0}),
])
def test_billed_running_and_waste(tpus, attempts, billed, running, waste):
    rows = cost_rows(tpus, attempts, now=T0 + 6 * H)
    sums = totals(rows)
    assert sums["billed"] == pytest.approx(billed)
    assert sums["running"] == pytest.approx(running)
    assert sums["waste"] == pytest.approx(waste)
    assert {r.day for r in rows} <= {"2026-12-01", "2026-12-02"}


def test_per_day_and_type_and_the_chart():
    rows = cost_rows([tpu("a", T0, T0 + 4 * H), tpu("b", T0, T0 + H, "v4-32")], [], now=T0 + 6 * H)
    assert [(r.day, r.type, r.billed) for r in rows] == [
        ("2026-12-01", "v4-32", pytest.approx(4.0)), ("2026-12-01", "v4-8", pytest.approx(2.0)),
        ("2026-12-02", "v4-8", pytest.approx(2.0))]
    chart = chart_data(rows)
    series = {s["name"]: s["values"] for s in chart["series"]}
    assert chart["labels"] == ["2026-12-01", "2026-12-02"] and series["billed"] == [6.0, 2.0]
    assert series["idle"] == [6.0, 2.0]  # nothing ran: every billed hour was idle


def test_the_charts_use_bar_adds_up_to_the_billed_one():
    rows = cost_rows([tpu("b", T0, T0 + H, "v4-32")], [attempt("b", T0, T0 + H / 2, "preempted")], now=T0 + 6 * H)
    series = chart_data(rows)["series"]
    billed = [s["values"] for s in series if s["stack"] == "billed"]
    used = [s["values"] for s in series if s["stack"] == "use"]
    assert [sum(day) for day in zip(*used)] == pytest.approx(billed[0])


def test_the_janitor_still_marks_surplus_racers_so():
    from tpuq.janitor import handlers

    assert f'"{SURPLUS_REASON}: its race was already won"' in inspect.getsource(handlers)


def test_a_multislice_attempt_runs_on_every_slice_of_its_gang():
    # two v4-32 slices (4 hosts each) alive 2 h, one 2-slice attempt for 1 h: 8 VM-hours running, 8 idle
    gang = [f"projects/p/locations/z/nodes/g-{i}" for i in range(2)]
    run = {**attempt("g-0", T0, T0 + H, "succeeded"), "gang": gang}
    sums = totals(cost_rows([tpu(f"g-{i}", T0, T0 + 2 * H, "v4-32") for i in range(2)], [run], now=T0 + 3 * H))
    assert sums["billed"] == pytest.approx(16) and sums["running"] == pytest.approx(8)
    assert sums["waste"]["idle"] == pytest.approx(8)
