"""`tpuq demo` and `tpuq dev ...`, which tpuq's CLI finds through the `tpuq.commands` entry point (register).

The local stack is imported inside the command functions only, so that `tpuq --help` stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tpuq.cli.console import CliError, err, out
from tpuq.cli.files import load_yaml_file, validate_data


def demo(state_dir: Optional[Path] = typer.Option(None, help="Keep the demo's state and logs here")) -> None:
    """Run the end-to-end demo on a local stack it starts and stops itself."""
    from tpuq_dev.demo import run

    result = run(out, state_dir)
    if not result.ok:
        raise typer.Exit(1)


def _stack(state_dir: Optional[Path] = None):
    from tpuq_dev.devstack.stack import DevStack, default_state_dir

    return DevStack(state_dir=state_dir or default_state_dir())


def dev_up(
    state_dir: Optional[Path] = typer.Option(None, help="Where state, logs and env go (default ~/.tpuq/dev or $TPUQ_DEV_DIR)"),
    scenario: Optional[Path] = typer.Option(None, help="Fake Cloud TPU scenario (default: the demo's: 3 v4 zones, one stocked out)"),
    fleet_file: Optional[Path] = typer.Option(None, "--fleet", help="Fleet file to store (default: the demo's fleet)"),
    time_scale: float = typer.Option(60.0, min=1.0, help="Fake TPU scenario seconds per real second"),
    tick_period: float = typer.Option(5.0, min=0.0, help="Seconds between ticks (0: no tick source)"),
    no_tpu: bool = typer.Option(False, "--no-tpu", help="Only the emulators, fake GCS and the services"),
) -> None:
    """Start the local stack in the background on free loopback ports."""
    import time

    from tpuq_dev.devstack.stack import ALL_SERVICES_AVAILABLE, DEMO_DIR

    for path in (scenario, fleet_file):
        if path is not None and not path.is_file():
            raise CliError(f"{path}: no such file")
    if fleet_file is not None:
        validate_data(load_yaml_file(fleet_file), "fleet")
    s = _stack(state_dir)
    s.services = ALL_SERVICES_AVAILABLE()
    if not no_tpu:
        s.scenario = scenario or DEMO_DIR / "scenario.yaml"
        s.fleet_file = fleet_file or DEMO_DIR / "fleet.yaml"
        s.time_scale = time_scale
        s.tick_period = tick_period or None
    started = time.monotonic()
    with err.status("starting the local stack..."):
        s.up()
    out.print(f"local stack ready in {time.monotonic() - started:.1f}s; state in {s.state_dir}")
    names = [row["name"] for row in s.status()]
    out.print(f"started {len(names)} processes: {', '.join(names)} (`tpuq dev status`: their pids and urls)",
              highlight=False, markup=False)
    from tpuq_dev.capacitymodel.scenario import load_scenario
    from tpuq_dev.devstack.describe import started_lines

    for line in started_lines(s.load_fleet(), load_scenario(s.scenario) if s.scenario else None, s.time_scale,
                              s.buckets):
        out.print(line, highlight=False, markup=False)
    if s.env.get("TPUQ_DEV_WEBHOOK_SECRET"):  # tpuq_dev.devstack.notifystack
        out.print(f"notifications: `notify: {{secret: {s.env['TPUQ_DEV_WEBHOOK_SECRET']}}}` sends to the local webhook "
                  "receiver; `tpuq dev notifications` shows what it got", highlight=False, markup=False)
    out.print('load its environment with:  eval "$(tpuq dev env)"')


def dev_down(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Stop exactly what `tpuq dev up` started."""
    stopped = _stack(state_dir).down()
    out.print(f"stopped {len(stopped)} process{'es' if len(stopped) != 1 else ''}" + (f": {', '.join(stopped)}" if stopped else ""))


def dev_env(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Print the stack's environment as export lines, for eval."""
    import shlex

    from tpuq.operations.stackenv import load_env

    for key, value in sorted(load_env(state_dir).items()):
        print(f"export {key}={shlex.quote(value)}")


def dev_status(state_dir: Optional[Path] = typer.Option(None), as_json: bool = typer.Option(False, "--json")) -> None:
    """Say what is running."""
    rows = _stack(state_dir).status()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("the local stack is not running (start it with `tpuq dev up`)")
        raise typer.Exit(1)
    table = Table("process", "pid", "url", "state")
    for r in rows:
        table.add_row(r["name"], str(r["pid"]), r["url"] or "", "[green]running[/green]" if r["alive"] else "[red]stopped[/red]")
    out.print(table)
    if not all(r["alive"] for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer, dev_app: typer.Typer) -> None:
    """The entry point tpuq.cli.app calls: add these commands to the `tpuq` app and its `dev` group."""
    from tpuq_dev.simulate_cli import simulate

    app.command("demo")(demo)
    app.command("simulate")(simulate)
    from tpuq_dev.devcommands import COMMANDS

    for name, command in (("up", dev_up), ("down", dev_down), ("env", dev_env), ("status", dev_status), *COMMANDS):
        dev_app.command(name)(command)
