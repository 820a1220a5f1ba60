"""What `tpuq dev up` started, in words: the fleet's entries, the fake TPU's scenario (zones, quota, scripted
stockouts, failures and preemptions, in real seconds at the stack's time scale) and the buckets.

Pure: from the parsed fleet file and scenario to lines of text.
"""

from __future__ import annotations

from tpuq_dev.capacitymodel.scenario import Scenario, Window
from tpuq.operations.fleetreport import entries_view, entry_line


def _secs(scenario_seconds: float, time_scale: float) -> str:
    return f"{scenario_seconds / time_scale:g} s"


def _when(window: Window, time_scale: float) -> str:
    if window.start == 0 and window.end is None:
        return "from the start"
    start = "from the start" if window.start == 0 else f"from {_secs(window.start, time_scale)}"
    return start + ("" if window.end is None else f" until {_secs(window.end, time_scale)}")


def _family(family: str | None) -> str:
    return family or "every family"


def scenario_lines(scenario: Scenario, time_scale: float) -> list[str]:
    """The scenario in words, times in real seconds (scenario seconds / time_scale)."""
    lines = []
    for zone, z in scenario.zones.items():
        quota = ", ".join(f"{family} " + " + ".join(f"{n} {tier}" for tier, n in (("spot", q.spot), ("on-demand", q.on_demand))
                                                   if n) + " chips" for family, q in z.quota.items()
                          if q.spot or q.on_demand)
        lines.append(f"zone {zone}: quota {quota or 'none'}")
        for s in z.stockouts:
            effect = "requests fail" if s.effect == "fail" else "requests wait"
            lines.append(f"zone {zone}: {_family(s.family)} stocked out {_when(s, time_scale)} ({effect})")
        for f in z.failures:
            lines.append(f"zone {zone}: {_family(f.family)} requests fail with {f.error} {_when(f, time_scale)}")
    for p in scenario.preemption.scripted:
        where = f"zone {p.zone}" if p.zone else "every zone"
        what = f"node {p.node_id}" if p.node_id else f"every {p.family} node" if p.family else "every node"
        when = (f"{_secs(p.after_active, time_scale)} after ACTIVE" if p.after_active is not None
                else f"at {_secs(p.at or 0, time_scale)}")
        lines.append(f"{where} preempts {what} {when}")
    if scenario.preemption.mean_spot_lifetime:
        lines.append(f"spot nodes live {_secs(scenario.preemption.mean_spot_lifetime, time_scale)} on average")
    d = scenario.delays
    typical = d.accepted + d.waiting.typical + d.provisioning.typical  # a distribution's median (or mean)
    lines.append(f"a slice turns ACTIVE about {_secs(typical, time_scale)} after it "
                 "is queued")
    if scenario.billing.disabled:
        lines.append("billing is disabled")
    for w in scenario.billing.disabled_windows:
        lines.append(f"billing is disabled {_when(w, time_scale)}")
    return lines


def started_lines(fleet, scenario: Scenario | None, time_scale: float, buckets: list[str]) -> list[str]:
    """Everything `tpuq dev up` prints about what it started."""
    lines = []
    if fleet is not None:
        lines.append(f"fleet {fleet.name} (the services use it; `tpuq fleet apply` a file named {fleet.name} "
                     "changes it):")
        lines += [f"  {entry_line(e)}" for e in entries_view(fleet)]
    if scenario is not None:
        lines.append(f"fake Cloud TPU (time scale {time_scale:g}x):")
        lines += [f"  {line}" for line in scenario_lines(scenario, time_scale)]
    lines.append("buckets: " + ", ".join(f"gs://{b}" for b in buckets))
    return lines
