"""The simulation's report: one self-contained HTML file (its charts embedded) with the PNGs beside it.

Per policy, a timeline of slices by state and the queue length; one bar chart of waste by cause for every policy
side by side; a summary table. The charts need matplotlib (`pip install 'tpuq[simulate]'`); without it the
report is the table and a line saying how to get them.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path

from .metrics import FirestoreOps, Metrics, SliceState, WasteCause
from .polling import RECONCILE_SECONDS

INSTALL_HINT = "pip install 'tpuq[simulate]'"
MISSING_MATPLOTLIB = f"the report's charts need matplotlib, which this install lacks: {INSTALL_HINT}"
REPORT_NAME = "report.html"
STATE_COLORS = {SliceState.provisioning: "#f2b134", SliceState.busy: "#2a9d8f", SliceState.idle: "#e76f51"}
CAUSE_LABELS = {
    WasteCause.losers_active: "race losers\n(READY, never used)",
    WasteCause.provisioning_for_nothing: "PROVISIONING\nfor nothing",
    WasteCause.idle: "idle",
    WasteCause.lost_to_preemption: "work lost to\npreemption",
    WasteCause.setup: "setup",
    WasteCause.provisioning: "provisioning\n(used slices)",
}


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "policy"


def _time_axis(horizon: float) -> tuple[float, str]:
    return (86400.0, "days") if horizon > 2 * 86400 else (3600.0, "hours")


def _timeline_png(m: Metrics) -> bytes:
    from matplotlib.figure import Figure

    series = m.series
    unit, label = _time_axis(m.horizon_seconds)
    t = [x / unit for x in series.t]
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    states = (SliceState.busy, SliceState.idle, SliceState.provisioning)
    top.stackplot(t, *(getattr(series, s.value) for s in states), labels=[s.value for s in states],
                  colors=[STATE_COLORS[s] for s in states], step="post")
    top.set_ylabel("slices")
    top.legend(loc="upper right", fontsize="small")
    top.set_title(f"{m.policy}: slices by state")
    bottom.step(t, series.queue, where="post", color="#264653")
    bottom.fill_between(t, series.queue, step="post", color="#264653", alpha=0.25)
    bottom.set_ylabel("jobs queued")
    bottom.set_xlabel(label)
    bottom.set_xlim(0, m.horizon_seconds / unit)
    return _png(fig)


def _waste_png(results: Sequence[Metrics]) -> bytes:
    from matplotlib.figure import Figure

    causes = list(WasteCause)
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(results))
    for i, m in enumerate(results):
        xs = [c + (i - (len(results) - 1) / 2) * width for c in range(len(causes))]
        ax.bar(xs, [m.waste_vm_hours.get(c.value, 0.0) for c in causes], width, label=m.policy)
    ax.set_xticks(range(len(causes)), [CAUSE_LABELS[c] for c in causes], fontsize="small")
    ax.set_ylabel("VM-hours")
    ax.set_title("waste by cause")
    ax.legend()
    return _png(fig)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def duration_text(seconds: float | None) -> str:
    """A wait or a makespan as the CLI's table and the report show it: minutes under an hour, else hours."""
    if seconds is None:
        return "–"
    return f"{seconds / 60:.0f} min" if abs(seconds) < 3600 else f"{seconds / 3600:.1f} h"


def percent_text(fraction: float | None) -> str:
    return "–" if fraction is None else f"{100 * fraction:.1f}%"


def firestore_text(ops: FirestoreOps | None) -> str:
    """Firestore reads / writes a day, as the CLI's table and the report show them (only the tpuq policy has any)."""
    return "–" if ops is None else f"{ops.reads_per_day:,.0f} / {ops.writes_per_day:,.0f}"


def firestore_readers_text(ops: FirestoreOps | None) -> str:
    """The subscriptions whose handlings read most, reads a day each (only the tpuq policy has any)."""
    from .storeops import top_readers_text

    return "–" if ops is None else top_readers_text(ops.by_subscription)


def _summary_rows(results: Sequence[Metrics]) -> list[tuple[str, list[str]]]:
    return [
        ("utilization (useful / billed chip-hours)", [percent_text(m.utilization) for m in results]),
        ("useful chip-hours", [f"{m.useful_chip_hours:,.0f}" for m in results]),
        ("billed chip-hours", [f"{m.billed_chip_hours:,.0f}" for m in results]),
        ("wasted VM-hours", [f"{m.wasted_vm_hours:,.0f}" for m in results]),
        ("jobs finished / submitted", [f"{m.jobs.finished} / {m.jobs.submitted}" for m in results]),
        ("wait p50 / p95 / max", [" / ".join(duration_text(getattr(m.jobs.wait["all"], k))
                                             for k in ("p50", "p95", "max")) for m in results]),
        ("wait p95, high priority", [duration_text(m.jobs.wait["high"].p95) for m in results]),
        ("makespan", [duration_text(m.jobs.makespan_seconds) for m in results]),
        ("attempts per job (mean)", ["–" if m.jobs.attempts_mean is None else f"{m.jobs.attempts_mean:.2f}"
                                     for m in results]),
        ("slices (never READY / never used)", [f"{m.slices} ({m.slices_never_ready} / {m.slices_never_used})"
                                               for m in results]),
        ("API calls", [f"{m.api_calls_total:,}" for m in results]),
        ("Firestore reads / writes a day", [firestore_text(m.firestore) for m in results]),
        ("Firestore reads a day, largest readers", [firestore_readers_text(m.firestore) for m in results]),
        ("creates per zone", [", ".join(f"{z}: {n}" for z, n in m.creates_per_zone.items()) or "–"
                              for m in results]),
    ]


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .7em;text-align:right}
th:first-child,td:first-child{text-align:left}img{max-width:100%;display:block;margin:1em 0}
.note{background:#fff3cd;padding:.6em 1em;border-left:4px solid #f2b134}"""


# What each policy is, in one line (the report and `tpuq simulate`'s table; docs/SIMULATING.md says more).
POLICY_MEANINGS = {
    "tpuq": "tpuq's four services, their own handlers, on the modelled cloud",
    "polling": f"a tpu-runner-like controller polling every {RECONCILE_SECONDS:g} s, each zone given the entry's "
               "whole count",
    "polling-split": "the same controller, each entry's count shared out over its zones",
    "bound": "the offline bound: a slice the instant capacity exists, no race losers, no idle time",
}
JOBS_NOTE = "jobs finished: those ended by the horizon; a job still waiting or running then counts as not finished"


def policy_lines(policies: Sequence[str]) -> list[str]:
    """One line per policy shown, `name: what it is` (once for `--compare`'s "tpuq (a.yaml)" and "tpuq (b.yaml)"),
    then what "jobs finished" counts."""
    names = dict.fromkeys(p.split(" (")[0] for p in policies)
    return [f"{p}: {POLICY_MEANINGS[p]}" for p in names if p in POLICY_MEANINGS] + [JOBS_NOTE]


def days_text(days: float) -> str:
    """`1 day`, `2.5 days`."""
    return f"{days:g} day" + ("" if days == 1 else "s")


def write_report(out_dir: str | Path, results: Sequence[Metrics], title: str) -> Path:
    """Write report.html (and, with matplotlib, its PNG charts) into out_dir; the HTML's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{esc(title)}</h1>",
             f"<p>{days_text(max((m.horizon_seconds for m in results), default=0) / 86400)} simulated; "
             "figures explained in tpuq's docs/SIMULATING.md.</p>",
             "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in policy_lines([m.policy for m in results])) + "</ul>",
             "<h2>Summary</h2><table><tr><th></th>" + "".join(f"<th>{esc(m.policy)}</th>" for m in results) + "</tr>"]
    for name, cells in _summary_rows(results):
        parts.append(f"<tr><td>{esc(name)}</td>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    if not have_matplotlib():
        parts.append(f"<p class='note'>No charts: {esc(MISSING_MATPLOTLIB)}</p>")
    else:
        charts = [("Waste by cause", "waste.png", _waste_png(results))]
        charts += [(f"{m.policy}: slices and queue over time", f"timeline-{_slug(m.policy)}.png", _timeline_png(m))
                   for m in results if m.series is not None]
        for heading, name, png in charts:
            (out / name).write_bytes(png)
            parts.append(f"<h2>{esc(heading)}</h2><img alt='{esc(heading)}' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'>")
    parts.append("<h2>Waste by cause (VM-hours)</h2><table><tr><th></th>"
                 + "".join(f"<th>{esc(m.policy)}</th>" for m in results) + "</tr>")
    for cause in WasteCause:
        parts.append(f"<tr><td>{esc(CAUSE_LABELS[cause].replace(chr(10), ' '))}</td>"
                     + "".join(f"<td>{m.waste_vm_hours.get(cause.value, 0.0):,.1f}</td>" for m in results) + "</tr>")
    parts.append("</table></body></html>\n")
    path = out / REPORT_NAME
    path.write_text("\n".join(parts))
    return path
