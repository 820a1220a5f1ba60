"""The `tpuq` typer app: its command table, and `main`, the boundary where errors become one line.

Errors are one clear line on stderr and a non-zero exit; tracebacks are for
bugs only (set TPUQ_DEBUG=1 to see them for any error).
"""

from __future__ import annotations

import os

import typer
from rich.markup import escape

from tpuq.cli import deploy, dev, files, fleet, jobs
from tpuq.cli.console import CliError, err, one_line
from tpuq.errors import TpuqError
from tpuq.stackenv import StackError

app = typer.Typer(help="tpuq: an event-driven job queue for Cloud TPU allocations.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
dev_app = typer.Typer(help="The local cloud stack (emulators, fake TPU API, services).", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
fleet_app = typer.Typer(help="Queued resources, TPUs, states, idle times and blocked reasons; `apply` stores a fleet file.",
                        invoke_without_command=True)
app.add_typer(fleet_app, name="fleet")

# The command table: (group, name, function), in the order `tpuq --help` lists them.
COMMANDS = (
    (app, "validate", files.validate), (app, "demo", dev.demo), (app, "init", files.init),
    (app, "submit", jobs.submit), (app, "status", jobs.status), (app, "list", jobs.list_),
    (app, "cancel", jobs.cancel), (app, "logs", jobs.logs), (app, "watch", jobs.watch),
    (fleet_app, "unblock", fleet.fleet_unblock), (fleet_app, "apply", fleet.fleet_apply),
    (fleet_app, "pause", fleet.fleet_pause), (fleet_app, "resume", fleet.fleet_resume),
    (fleet_app, "drain", fleet.fleet_drain),
    (app, "deploy", deploy.deploy), (app, "undeploy", deploy.undeploy),
    (dev_app, "up", dev.dev_up), (dev_app, "down", dev.dev_down), (dev_app, "env", dev.dev_env),
    (dev_app, "status", dev.dev_status),
)
for group, name, command in COMMANDS:
    group.command(name)(command)
fleet_app.callback()(fleet.fleet)  # `tpuq fleet` alone shows the fleet


def main(argv: list[str] | None = None) -> int:
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
            err.print(f"[red]error:[/red] {escape(one_line(e))}", highlight=False)  # a message's [..] is text
        else:
            err.print(f"[red]error:[/red] {type(e).__name__}: {escape(one_line(e))}", highlight=False)
        return 1
