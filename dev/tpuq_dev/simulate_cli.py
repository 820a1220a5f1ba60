"""`tpuq simulate`: a month of a TPU grant in a minute, with the services' own decision code (tpuq_dev.simulate).

Bad input (a file that does not parse, an unknown field, an impossible distribution, a fleet type the scenario
does not offer) is one line on stderr and exit 2, before anything runs.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from tpuq.cli.console import CliError, err, one_line, out

DAY = 86400.0
DEFAULT_POLICIES = ("tpuq", "polling", "bound")
EXAMPLES = Path(__file__).resolve().parent / "simulate" / "examples"
EXAMPLE_FILES = {"fleet": "trc-fleet.yaml", "scenario": "trc-scenario.yaml", "workload": "trc-workload.yaml"}
DEFAULT_OUT = Path("tpuq-simulation")
EXIT_USAGE = 2


class BadInput(CliError):
    """Input the user must fix: one line, exit 2."""


@dataclass
class Inputs:
    fleet_path: Path
    fleet: object  # tpuq.contracts.fleet.FleetFile
    scenario: object  # tpuq_dev.capacitymodel.scenario.Scenario
    jobs: list  # list[SimJob]
    workload_path: Optional[Path] = None


# -- reading and checking the files -----------------------------------------------------------------


def _read_yaml(kind: str, path: Path) -> object:
    """The file's data, or BadInput `KIND PATH: no such file` (not a text file, not valid YAML at line L...)."""
    from tpuq.cli.files import load_yaml_file

    try:
        return load_yaml_file(path)
    except CliError as e:
        message = one_line(e)
        raise BadInput(f"{kind} {path}: {message.removeprefix(f'{path}: ')}") from None


def _load_fleet(path: Path):
    from tpuq.cli.files import validate_data

    data = _read_yaml("fleet", path)
    try:
        return validate_data(data, "fleet")
    except CliError as e:
        raise BadInput(f"fleet {path}: {one_line(e)}") from None


_PYDANTIC_PHRASES = (("Extra inputs are not permitted", "unknown field"), ("Field required", "is required"),
                     ("Value error, ", ""),
                     ("Input should be greater than or equal to", "must be >="),
                     ("Input should be greater than", "must be >"),
                     ("Input should be less than or equal to", "must be <="),
                     ("Input should be less than", "must be <"))
_LIST_INDEX = re.compile(r"[.]([0-9]+)(?=[.]|$)")
_PYDANTIC_TAG = re.compile(r"^(?P<where>[^:]*): Input tag '(?P<tag>[^']*)' found using '(?P<key>[^']*)' does not match "
                           r"any of the expected tags: (?P<tags>.*)$")


def _plain(problem: str) -> str:
    """A scenario's pydantic line as the workload's read: `a.b[1].c: must be < 1`, `d.dist: 'x' is not one of ...`."""
    tag = _PYDANTIC_TAG.match(problem)
    if tag:
        problem = f"{tag['where']}.{tag['key']}: '{tag['tag']}' is not one of {tag['tags'].replace(chr(39), '')}"
    where, _, reason = problem.partition(": ")
    for phrase, plain in _PYDANTIC_PHRASES:
        reason = reason.replace(phrase, plain)
    return _LIST_INDEX.sub(r"[\1]", where) + f": {reason}"


def _load_scenario(path: Path):
    from tpuq_dev.capacitymodel.scenario import ScenarioError, parse_scenario

    data = _read_yaml("scenario", path)
    try:
        return parse_scenario(data, source=f"scenario {path}")
    except ScenarioError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        problem = _plain(lines[1]) if len(lines) > 1 else lines[0]
        more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
        raise BadInput(f"scenario {path}: {problem}{more}") from None


def _load_jobs(path: Path, seed: int, horizon: float) -> list:
    from tpuq_dev.simulate.workload import WorkloadError, generate, load_workload

    if not path.exists():
        raise BadInput(f"workload {path}: no such file")
    try:
        jobs = generate(load_workload(path), seed, horizon)
    except WorkloadError as e:
        message = str(e)  # a file's own problem names the file; a field's is prefixed with it
        raise BadInput(message if message.startswith(f"workload {path}") else f"{path}: {message}") from None
    if not jobs:
        raise BadInput(f"workload {path}: no job is submitted within --days {horizon / DAY:g}")
    return jobs


def check_fleet_against_scenario(fleet, scenario) -> None:
    """Every entry's zones are the scenario's and hold quota for at least one of its slices."""
    zones = ", ".join(sorted(scenario.zones)) or "none"
    for i, entry in enumerate(fleet.tpus):
        if entry.existing:
            continue  # a node tpuq did not create: the simulated cloud has none, so the entry claims nothing
        accel = entry.accelerator
        tier = "spot" if entry.spot else "on_demand"
        where = f"fleet tpus[{i}] ({entry.id})"
        for zone in entry.zones:
            if not scenario.has_zone(zone):
                raise BadInput(f"{where}: zone {zone} is not in the scenario (its zones: {zones})")
            quota = scenario.quota_limit(zone, accel.family, tier)  # None: no limit of the zone's own
            if quota is not None and quota < accel.chips:
                tier_name = tier.replace("_", "-")
                raise BadInput(f"{where}: the scenario offers {quota} {tier_name} {accel.family} chips in {zone}, "
                               f"less than one {accel.name} slice ({accel.chips} chips)")


def check_jobs_against_fleet(jobs: list, fleet) -> None:
    """Every job can run somewhere: one of its types, in one of its regions (if it names any), is a fleet entry's."""
    from tpuq.contracts.tputypes import zone_region

    created = [entry for entry in fleet.tpus if not entry.existing]  # the simulated cloud has no one else's node
    offered = {(entry.accelerator.name, zone_region(zone)) for entry in created for zone in entry.zones}
    types = sorted({t for t, _ in offered})
    adopted = "; the simulated cloud has no existing: node" if len(created) < len(fleet.tpus) else ""
    for job in jobs:
        if not set(types).intersection(job.types):
            raise BadInput(f"workload: job {job.job_id} wants {', '.join(job.types)}, which no fleet entry offers "
                           f"(the fleet's types: {', '.join(types) or 'none'}{adopted})")
        if job.regions and not any((t, r) in offered for t in job.types for r in job.regions):
            where = ", ".join(f"{t} in {r}" for t, r in sorted(offered))
            raise BadInput(f"workload: job {job.job_id} wants {' or '.join(job.types)} in {' or '.join(job.regions)}"
                           f", which no fleet entry offers (the fleet's: {where})")


def read_inputs(fleet_path: Path, scenario_path: Path, workload_path: Path, seed: int, horizon: float,
                scenario=None) -> Inputs:
    fleet = _load_fleet(fleet_path)
    scenario = scenario if scenario is not None else _load_scenario(scenario_path)
    check_fleet_against_scenario(fleet, scenario)
    jobs = _load_jobs(workload_path, seed, horizon)
    check_jobs_against_fleet(jobs, fleet)
    return Inputs(fleet_path, fleet, scenario, jobs, workload_path)


# -- running -------------------------------------------------------------------------------------------


class PolicyUnavailable(Exception):
    pass


def _bound_metrics(inputs: Inputs, horizon: float):
    from tpuq_dev.simulate.metrics import bound_records, summarize
    from tpuq_dev.simulate.workers import SimWorkers

    try:
        from tpuq_dev.simulate.bound import compute_bound
    except ImportError:
        raise PolicyUnavailable("bound not available in this tpuq") from None
    setup = SimWorkers.setup_seconds  # the bound pays the same setup as the policies' workers
    options = {"setup_seconds": setup} if "setup_seconds" in inspect.signature(compute_bound).parameters else {}
    result = compute_bound(inputs.scenario, inputs.fleet, inputs.jobs, horizon, **options)
    runs, slices = bound_records(result.attempts, setup if options else 0.0, horizon)
    return summarize("bound", inputs.jobs, runs, slices, {}, {}, horizon)


def _days(days: float) -> str:
    from tpuq_dev.simulate.report import days_text

    return days_text(days)


def run_policy(policy: str, inputs: Inputs, horizon: float, seed: int,
               on_progress: Callable[[float], None] | None = None, **policy_options):
    """The policy's Metrics on these inputs (`policy_options`: the policy driver's own, e.g. polling's
    `split_counts`)."""
    from tpuq_dev.simulate.metrics import summarize
    from tpuq_dev.simulate.run import simulate

    if policy != "tpuq" and any(getattr(job, "multislice", False) for job in inputs.jobs):
        # The polling model and the bound place one slice per attempt: a gang's figures would be wrong, not rough.
        raise PolicyUnavailable(f"{policy}: does not model multislice jobs (slices:); only the tpuq policy runs them")
    if policy == "bound":
        return _bound_metrics(inputs, horizon)
    try:
        run = simulate(policy, fleet=inputs.fleet, scenario=inputs.scenario, jobs=inputs.jobs, horizon=horizon,
                       seed=seed, on_progress=on_progress, **policy_options)
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("tpuq_dev.simulate."):
            raise PolicyUnavailable(f"{policy} not available in this tpuq") from None
        raise
    firestore_ops = getattr(run.driver, "firestore_ops", None)
    return summarize(policy, run.jobs, run.workers.runs, getattr(run, "slices", None) or [], run.cloud.calls,
                     run.cloud.creates_per_zone, run.horizon,
                     firestore=firestore_ops(run.horizon) if firestore_ops is not None else None)


@contextmanager
def _services_quiet() -> Iterator[None]:
    """The services' own log lines (a month of them) are for TPUQ_DEBUG=1, not for the user of this command."""
    if os.environ.get("TPUQ_DEBUG"):
        yield
        return
    logger = logging.getLogger("tpuq")
    handler, propagate = logging.NullHandler(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextmanager
def _progress(total_days: float) -> Iterator[Callable[[str], Callable[[float], None]]]:
    """A factory of on_progress callbacks, one bar per run, shown only on a terminal."""
    if not err.is_terminal:
        yield lambda label: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:g} days"),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        def make(label: str) -> Callable[[float], None]:
            task = bar.add_task(label, total=total_days)
            return lambda seconds: bar.update(task, completed=seconds / DAY)
        yield make


def run_policies(policies: list[str], inputs: Inputs, horizon: float, seed: int,
                 label: str = "") -> tuple[list, list[str]]:
    """(metrics of each policy that ran, a note for each that is not available)."""
    results, notes = [], []
    with _services_quiet(), _progress(horizon / DAY) as progress:
        for policy in policies:
            try:
                results.append(run_policy(policy, inputs, horizon, seed,
                                          progress(f"{policy}{label}") if policy != "bound" else None))
            except PolicyUnavailable as e:
                notes.append(str(e))
    return results, notes


# -- output ---------------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    from tpuq_dev.simulate.report import percent_text

    return percent_text(value)


def _hours(seconds: float | None) -> str:
    from tpuq_dev.simulate.report import duration_text

    return duration_text(seconds)


SUMMARY = (
    ("utilization", lambda m: _pct(m.utilization)),
    ("wasted VM-hours", lambda m: f"{m.wasted_vm_hours:,.1f}"),
    ("jobs finished", lambda m: f"{m.jobs.finished}/{m.jobs.submitted}"),
    ("wait p50", lambda m: _hours(m.jobs.wait["all"].p50)),
    ("wait p95", lambda m: _hours(m.jobs.wait["all"].p95)),
    ("wait max", lambda m: _hours(m.jobs.wait["all"].max)),
    ("API calls", lambda m: f"{m.api_calls_total:,}"),
    ("Firestore reads / writes a day", lambda m: _firestore_text(m.firestore)),
    ("Firestore reads a day, largest readers", lambda m: _firestore_readers_text(m.firestore)),
)


def _firestore_text(ops) -> str:
    from tpuq_dev.simulate.report import firestore_text

    return firestore_text(ops)


def _firestore_readers_text(ops) -> str:
    from tpuq_dev.simulate.report import firestore_readers_text

    return firestore_readers_text(ops)


def _print_table(results: list, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for m in results:
        table.add_column(m.policy, justify="right")
    for name, cell in SUMMARY:
        table.add_row(name, *(cell(m) for m in results))
    out.print(table)
    from tpuq_dev.simulate.report import policy_lines

    for line in policy_lines([m.policy for m in results]):
        out.print(line, highlight=False, markup=False)


def compare_figures(a, b) -> dict:
    """b - a for the figures `--compare` prints (None where either side has none)."""
    def diff(x, y):
        return None if x is None or y is None else y - x

    return {
        "utilization": diff(a.utilization, b.utilization),
        "wasted_vm_hours": diff(a.wasted_vm_hours, b.wasted_vm_hours),
        "jobs_finished": b.jobs.finished - a.jobs.finished,
        "wait_p50_seconds": diff(a.jobs.wait["all"].p50, b.jobs.wait["all"].p50),
        "wait_p95_seconds": diff(a.jobs.wait["all"].p95, b.jobs.wait["all"].p95),
        "wait_max_seconds": diff(a.jobs.wait["all"].max, b.jobs.wait["all"].max),
    }


def _signed(value: float | None, fmt: Callable[[float], str]) -> str:
    return "–" if value is None else ("+" if value > 0 else "") + fmt(value)


def _print_compare(policy: str, names: tuple[str, str], a, b) -> None:
    d = compare_figures(a, b)
    table = Table(title=f"{policy}: {names[0]} vs {names[1]}", title_justify="left")
    for column in ("", names[0], names[1], "difference"):
        table.add_column(column, justify="left" if not column else "right")
    rows = (
        ("utilization", _pct(a.utilization), _pct(b.utilization),
         _signed(d["utilization"], lambda v: f"{100 * v:.1f} points")),
        ("wasted VM-hours", f"{a.wasted_vm_hours:,.1f}", f"{b.wasted_vm_hours:,.1f}",
         _signed(d["wasted_vm_hours"], lambda v: f"{v:,.1f}")),
        ("jobs finished", str(a.jobs.finished), str(b.jobs.finished), _signed(d["jobs_finished"], str)),
        *((f"wait {k}", _hours(getattr(a.jobs.wait["all"], k)), _hours(getattr(b.jobs.wait["all"], k)),
           _signed(d[f"wait_{k}_seconds"], _hours)) for k in ("p50", "p95", "max")),
    )
    for row in rows:
        table.add_row(*row)
    out.print(table)


def brake_notes(fleet, horizon: float, policies: list[str]) -> list[str]:
    """The fleet's brakes that bind the tpuq policy (the services read them) but not polling's or the bound's."""
    from datetime import timedelta

    from tpuq_dev.simulate.events import DEFAULT_START

    if "tpuq" not in policies:
        return []
    notes = []
    start, end = DEFAULT_START.date(), (DEFAULT_START + timedelta(seconds=horizon)).date()
    if fleet.grant_expires is not None and fleet.grant_expires < end:
        notes.append(f"the fleet's grant_expires ({fleet.grant_expires}) comes before the run ends (it runs {start} "
                     f"to {end}): the tpuq policy claims nothing after it; polling and bound ignore it")
    if fleet.budget is not None:
        notes.append(f"the fleet's budget ({fleet.budget.vm_hours_per_day:g} VM-hours a day) brakes the tpuq policy "
                     "only")
    return notes


def _print_notes(unavailable: list[str], results: list) -> None:
    notes = list(unavailable)
    for m in results:
        if m.runs_without_slice:
            notes.append(f"{m.policy}: {m.runs_without_slice} attempts ran on slices this run did not record, so its "
                         "utilization and waste leave them out")
    for note in notes:
        _note(note)


def _note(text: str) -> None:
    err.print(f"note: {escape(text)}", highlight=False)


def _print_report_link(report: Path) -> None:
    """A file:// link, which a terminal opens with a click from whatever directory it is in; never wrapped."""
    out.print(f"report: {report.resolve().as_uri()}", soft_wrap=True, highlight=False)


def _write_report(out_dir: Path, results: list, title: str) -> Path:
    from tpuq_dev.simulate.report import MISSING_MATPLOTLIB, have_matplotlib, write_report

    path = write_report(out_dir, results, title)
    (out_dir / "metrics.json").write_text(json.dumps([json.loads(m.to_json()) for m in results], indent=1) + "\n")
    if not have_matplotlib():
        _note(MISSING_MATPLOTLIB)
    return path


# -- the command ------------------------------------------------------------------------------------------


def _usage_error(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(EXIT_USAGE)


def _two_fleets(value: Optional[tuple[Path, Path]]) -> Optional[tuple[Path, Path]]:
    """`--compare F1 --scenario S` takes `--scenario` for F2: say so, not "unexpected extra argument S"."""
    for which, path in zip(("first", "second"), value or ()):
        if str(path).startswith("-"):
            raise _usage_error(f"--compare: takes two fleet files (FLEET1 FLEET2), got {str(path)!r} as the {which}")
    return value


def _compare_kind(paths: tuple[Path, Path]) -> str:
    """"fleet" when both `--compare` files are fleet files, "workload" when both are workload files (a `.jsonl`
    trace, or YAML without `tpus:`); the files' own problems are reported when they are read."""
    from tpuq_dev.simulate.workload import TRACE_SUFFIXES

    kinds = []
    for path in paths:
        data = None if path.suffix in TRACE_SUFFIXES or not path.is_file() else _read_yaml("--compare", path)
        kinds.append("fleet" if isinstance(data, dict) and "tpus" in data else
                     "workload" if path.suffix in TRACE_SUFFIXES or isinstance(data, dict) else "fleet")
    if kinds[0] != kinds[1]:
        raise BadInput(f"--compare: give two fleet files or two workload files, not a {kinds[0]} ({paths[0]}) and a "
                       f"{kinds[1]} ({paths[1]})")
    return kinds[0]


def _check_out(out_dir: Path) -> None:
    """The report's directory can be made, before a run of minutes that would end in a traceback."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--out {out_dir}: cannot write the report there: it is a file, not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {out_dir}: cannot write the report there: {(e.strerror or str(e)).lower()}") from None


def _input_paths(example: bool, fleet: Optional[Path], scenario: Optional[Path],
                 workload: Optional[Path]) -> tuple[Path, Path, Path]:
    given = {"fleet": fleet, "scenario": scenario, "workload": workload}
    if example:
        given = {k: v or EXAMPLES / EXAMPLE_FILES[k] for k, v in given.items()}
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise BadInput(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or --example for "
                       "the standard scenario's files)")
    return given["fleet"], given["scenario"], given["workload"]


def simulate(
    fleet: Optional[Path] = typer.Option(None, "--fleet", metavar="FLEET", help="A tpuq fleet file"),
    scenario: Optional[Path] = typer.Option(None, "--scenario", metavar="SCENARIO",
                                            help="A capacity-model scenario file (quota, stockouts, preemptions, "
                                                 "delays)"),
    workload: Optional[Path] = typer.Option(None, "--workload", metavar="WORKLOAD",
                                            help="A workload file: generated jobs, or a trace"),
    example: bool = typer.Option(False, "--example", "--standard",
                                 help="The standard scenario's files (a TRC-like grant, 2,000 jobs over 30 days) "
                                      "for whichever of --fleet, --scenario, --workload is not given"),
    days: float = typer.Option(30.0, "--days", help="How long to simulate"),
    seed: int = typer.Option(0, "--seed", help="The workload's and the services' seed (the scenario has its own)"),
    policies: Optional[list[str]] = typer.Option(
        None, "--policy", metavar="POLICY",
        help="tpuq, polling or bound; repeat for several (default: all three; with --compare: tpuq)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR",
                                           help=f"Where to write report.html and its charts (default: "
                                                f"./{DEFAULT_OUT}; with --json: none unless given)"),
    compare: Optional[tuple[Path, Path]] = typer.Option(
        None, "--compare", metavar="A B", callback=_two_fleets,
        help="Run the same scenario and seed on two fleet files (one --workload) or on two workload files (one "
             "--fleet), and print the difference"),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout"),
) -> None:
    """Simulate a TPU grant: the services' own decisions in virtual time, against a polling controller and the
    offline bound. Prints utilization, waste, waits and API calls; writes an HTML report with charts."""
    try:
        _simulate(fleet, scenario, workload, example, days, seed, policies, out_dir, compare, as_json)
    except BadInput as e:
        raise _usage_error(one_line(e)) from None


def _simulate(fleet, scenario, workload, example, days, seed, policies, out_dir, compare, as_json) -> None:
    from tpuq_dev.simulate.run import POLICIES

    if not days > 0 or days > 3650:
        raise BadInput(f"--days: must be > 0 and at most 3650, got {days:g}")
    for policy in policies or ():
        if policy not in POLICIES:
            raise BadInput(f"--policy: unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    horizon = days * DAY
    chosen = list(dict.fromkeys(policies or (["tpuq"] if compare else DEFAULT_POLICIES)))
    kind = _compare_kind(compare) if compare else None
    if kind == "fleet":
        if fleet is not None:
            raise BadInput("--compare: give the two fleet files there, not --fleet as well")
        fleet = compare[0]
    elif kind == "workload":
        if workload is not None:
            raise BadInput("--compare: give the two workload files there, not --workload as well")
        workload = compare[0]
    fleet_path, scenario_path, workload_path = _input_paths(example, fleet, scenario, workload)
    first = read_inputs(fleet_path, scenario_path, workload_path, seed, horizon)
    second = read_inputs(compare[1] if kind == "fleet" else fleet_path, scenario_path,
                         compare[1] if kind == "workload" else workload_path, seed, horizon,
                         scenario=_load_scenario(scenario_path)) if compare else None  # a fresh copy of the scenario
    for side in (first, second) if compare else (first,):
        for note in brake_notes(side.fleet, horizon, chosen):
            _note(f"{side.fleet_path.name}: {note}" if compare else note)
    if out_dir is None and not as_json:
        out_dir = DEFAULT_OUT
    if out_dir is not None:
        _check_out(out_dir)
    if compare:
        _compare(chosen, (first, second), horizon, seed, days, out_dir, as_json)
        return
    results, notes = run_policies(chosen, first, horizon, seed)
    _print_notes(notes, results)
    report = _write_report(out_dir, results, f"tpuq simulate: {fleet_path.name}, {_days(days)}, seed {seed}") \
        if out_dir is not None else None
    if as_json:
        print(json.dumps({"days": days, "seed": seed, "jobs": len(first.jobs), "unavailable": notes,
                          "results": [json.loads(m.to_json(series=False)) for m in results]}, sort_keys=True))
        return
    _print_table(results, f"{len(first.jobs)} jobs, {_days(days)}, seed {seed}")
    if report is not None:
        _print_report_link(report)


def _compare(policies: list[str], inputs: tuple[Inputs, Inputs], horizon: float, seed: int, days: float,
             out_dir: Optional[Path], as_json: bool) -> None:
    kind = "fleet" if inputs[0].fleet_path != inputs[1].fleet_path else "workload"
    paths = tuple(getattr(i, f"{kind}_path") for i in inputs)
    names = tuple(p.name for p in paths)
    if names[0] == names[1]:
        names = tuple(str(p) for p in paths)
    runs, notes = [], []
    for side, name in zip(inputs, names):
        results, missing = run_policies(policies, side, horizon, seed, label=f" ({name})")
        runs.append(results)
        notes += [n for n in missing if n not in notes]
    _print_notes(notes, runs[0] + runs[1])
    pairs = list(zip(runs[0], runs[1]))
    if out_dir is not None:
        labelled = [m.model_copy(update={"policy": f"{m.policy} ({name})"})
                    for pair in pairs for m, name in zip(pair, names)]
        report = _write_report(out_dir, labelled, f"tpuq simulate --compare {names[0]} {names[1]}, {_days(days)}, "
                                                  f"seed {seed}")
    if as_json:
        print(json.dumps({"days": days, "seed": seed, f"{kind}s": list(names), "unavailable": notes, "compare": [
            {"policy": a.policy, "results": [json.loads(a.to_json(series=False)), json.loads(b.to_json(series=False))],
             "difference": compare_figures(a, b)} for a, b in pairs]}, sort_keys=True))
        return
    for a, b in pairs:
        _print_compare(a.policy, names, a, b)
    if out_dir is not None:
        _print_report_link(report)
