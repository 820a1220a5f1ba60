"""The `tpuq` command line.

Errors are one clear line on stderr and a non-zero exit; tracebacks are for
bugs only (set TPUQ_DEBUG=1 to see them for any error).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tpuq.errors import TpuqError, describe_validation_error

app = typer.Typer(help="tpuq: an event-driven job queue for Cloud TPU allocations.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
dev_app = typer.Typer(help="The local cloud stack (emulators, fake TPU API, services).", no_args_is_help=True)
app.add_typer(dev_app, name="dev")

out = Console()
err = Console(stderr=True)


class CliError(Exception):
    """An error the user can act on: printed as one line."""


# ----------------------------------------------------------------- files
def load_yaml_file(path: Path) -> object:
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a directory, expected a YAML file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CliError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file") from None


def detect_kind(data: object) -> str:
    if isinstance(data, dict) and "tpus" in data:
        return "fleet"
    return "job"


def validate_data(data: object, kind: str):
    from tpuq.fleet import FleetFile
    from tpuq.jobspec import JobFile

    model = FleetFile if kind == "fleet" else JobFile
    if not isinstance(data, dict):
        raise CliError(f"expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        _, reason = describe_validation_error(e)
        raise CliError(f"invalid {kind} file: {reason}") from None


@app.command()
def validate(file: Path = typer.Argument(..., help="A fleet file or a job.yaml")) -> None:
    """Check a fleet or job file and say what is wrong, field by field."""
    data = load_yaml_file(file)
    kind = detect_kind(data)
    model = validate_data(data, kind)
    if kind == "fleet":
        out.print(f"[green]ok[/green]: fleet {model.name!r} with {len(model.tpus)} TPU entr{'y' if len(model.tpus) == 1 else 'ies'}")
    else:
        out.print(f"[green]ok[/green]: {len(model.jobs)} job{'s' if len(model.jobs) != 1 else ''}")


@app.command()
def demo(state_dir: Optional[Path] = typer.Option(None, help="Keep the demo's state and logs here")) -> None:
    """Run the end-to-end demo on a local stack it starts and stops itself."""
    from tpuq.demo import run

    summary = run(out, state_dir)
    if any(state in ("failed", "rejected") for state in summary.get("jobs", {}).values()):
        raise typer.Exit(1)


# ------------------------------------------------------------------- dev
def _stack(state_dir: Optional[Path] = None):
    from tpuq.devstack.stack import DevStack, default_state_dir

    return DevStack(state_dir=state_dir or default_state_dir())


@dev_app.command("up")
def dev_up(
    state_dir: Optional[Path] = typer.Option(None, help="Where state, logs and env go (default ~/.tpuq/dev or $TPUQ_DEV_DIR)"),
) -> None:
    """Start the local stack in the background on free loopback ports."""
    import time

    from tpuq.devstack.stack import ALL_SERVICES_AVAILABLE

    s = _stack(state_dir)
    s.services = ALL_SERVICES_AVAILABLE()
    started = time.monotonic()
    with err.status("starting the local stack..."):
        s.up()
    out.print(f"local stack ready in {time.monotonic() - started:.1f}s; state in {s.state_dir}")
    out.print('load its environment with:  eval "$(tpuq dev env)"')


@dev_app.command("down")
def dev_down(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Stop exactly what `tpuq dev up` started."""
    stopped = _stack(state_dir).down()
    out.print(f"stopped {len(stopped)} process{'es' if len(stopped) != 1 else ''}" + (f": {', '.join(stopped)}" if stopped else ""))


@dev_app.command("env")
def dev_env(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Print the stack's environment as export lines, for eval."""
    import shlex

    from tpuq.devstack.stack import load_env

    for key, value in sorted(load_env(state_dir).items()):
        print(f"export {key}={shlex.quote(value)}")


@dev_app.command("status")
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


# ------------------------------------------------------------------ main
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    from tpuq.devstack.stack import StackError

    try:
        rv = app(args=argv, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: one line, no traceback
        if os.environ.get("TPUQ_DEBUG"):
            raise
        import click

        if isinstance(e, click.exceptions.UsageError):
            e.show()
            return 2
        if isinstance(e, click.exceptions.ClickException):
            e.show()
            return e.exit_code
        if isinstance(e, (CliError, StackError, TpuqError)):
            err.print(f"[red]error:[/red] {_one_line(e)}", highlight=False)
        else:
            err.print(f"[red]error:[/red] {type(e).__name__}: {_one_line(e)}", highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
