"""The report: one HTML file that needs nothing beside it (charts embedded), the PNGs next to it, and without
matplotlib a report that says how to get the charts."""

from __future__ import annotations

import base64
import re

import pytest

from tpuq_dev.simulate import report
from tpuq_dev.simulate.metrics import SliceLife, summarize
from tpuq_dev.simulate.workers import AttemptRun, RunEnd
from tpuq_dev.simulate.workload import SimJob

H = 2 * 86400.0


def results():
    slices = [SliceLife("a", "us-central2-b", "v4-8", 4, 1, 0, 600, H),
              SliceLife("b", "us-central2-b", "v4-32", 16, 4, 100, None, 3000)]
    runs = [AttemptRun("j1", 1, "a", 4, 1000, 30, 0, ends_at=4630, ended_at=4630, end=RunEnd.finished,
                       kept_seconds=3600)]
    jobs = [SimJob("j1", 0, ("v4-8",), "high", 3600), SimJob("j2", 50, ("v4-32",), "low", 3600)]
    return [summarize(policy, jobs, runs, slices, {"queuedResources.create": 2}, {"us-central2-b": 2}, H)
            for policy in ("tpuq", "polling")]


def test_the_report_embeds_its_charts_and_writes_them_beside_it(tmp_path):
    pytest.importorskip("matplotlib")
    path = report.write_report(tmp_path / "out", results(), "a <test> run")
    assert path == tmp_path / "out" / "report.html"
    text = path.read_text()
    assert "<title>a &lt;test&gt; run</title>" in text
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 3  # the waste chart, and one timeline per policy
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert sorted(p.name for p in path.parent.glob("*.png")) == ["timeline-polling.png", "timeline-tpuq.png",
                                                                  "waste.png"]
    assert (path.parent / "waste.png").read_bytes() == base64.b64decode(images[0])
    assert "src='http" not in text and "<script" not in text  # self-contained
    for figure in ("utilization", "wasted VM-hours", "jobs finished / submitted", "wait p50 / p95 / max",
                   "API calls", "tpuq", "polling"):
        assert figure in text
    # What each policy is, and what "finished" counts, said beside the figures (and under `tpuq simulate`'s table).
    assert "<li>polling: a tpu-runner-like controller polling every 30 s" in text
    assert "counts as not finished" in text


def test_one_day_is_one_day_and_a_compare_names_each_policy_once():
    assert report.days_text(1) == "1 day" and report.days_text(30) == "30 days" and report.days_text(2.5) == "2.5 days"
    lines = report.policy_lines(["tpuq (a.yaml)", "tpuq (b.yaml)"])
    assert lines[0].startswith("tpuq: ") and len(lines) == 2


def test_without_matplotlib_the_report_is_the_table_and_how_to_install_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "have_matplotlib", lambda: False)
    path = report.write_report(tmp_path, results(), "no charts")
    text = path.read_text()
    assert "pip install &#x27;tpuq[simulate]&#x27;" in text and "<img" not in text
    assert "wasted VM-hours" in text and not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("seconds, text", [
    (None, "–"), (0, "0 min"), (89, "1 min"), (2520, "42 min"), (-2520, "-42 min"), (3599, "60 min"),
    (3600, "1.0 h"), (5040, "1.4 h"), (-5040, "-1.4 h"), (200 * 3600, "200.0 h"),
])
def test_a_wait_under_an_hour_reads_in_minutes(seconds, text):
    """A short run's waits are minutes: "0.0 h" would hide them."""
    assert report.duration_text(seconds) == text


def test_the_cli_table_and_the_report_show_a_wait_the_same_way(tmp_path):
    from tpuq_dev.simulate_cli import SUMMARY

    tpuq_run = results()[0]
    wait = tpuq_run.jobs.wait["all"].p50
    assert wait < 3600 and dict(SUMMARY)["wait p50"](tpuq_run) == report.duration_text(wait) == f"{wait / 60:.0f} min"
    assert f"{wait / 60:.0f} min / " in report.write_report(tmp_path, [tpuq_run], "t").read_text()
