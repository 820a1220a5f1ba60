"""The fleet commands: the fleet view, `fleet unblock`, `fleet apply`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tpuq.cli.connecting import cli_clients
from tpuq.cli.files import load_yaml_file, validate_data
from tpuq.cli.console import out
from tpuq.cli.views import json_default, print_fleet


def fleet(ctx: typer.Context, name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Queued resources, TPUs, states, idle times and blocked reasons."""
    if ctx.invoked_subcommand is not None:
        return
    from datetime import datetime, timezone

    from tpuq.cloudchecks import reader_from_settings
    from tpuq.fleetreport import fleet_view

    clients = cli_clients()
    view = fleet_view(clients.firestore, name, datetime.now(timezone.utc), reader_from_settings(clients.settings))
    if as_json:
        print(json.dumps(view, default=json_default, indent=2))
        return
    print_fleet(view)


def fleet_unblock(name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)")) -> None:
    """After fixing billing or permissions: let the claimer create again (clears the project-level block)."""
    from tpuq import store
    from tpuq.fleetstore import load_fleet

    clients = cli_clients()
    fleet_name = load_fleet(clients.firestore, name).name
    ref = clients.firestore.collection(store.FLEET_STATUS).document(fleet_name)
    snap = ref.get()
    if not snap.exists or not (snap.to_dict() or {}).get("blocked"):
        out.print(f"fleet {fleet_name!r} is not blocked")
        return
    ref.delete()
    out.print(f"fleet {fleet_name!r} unblocked (was: {snap.to_dict()['blocked']})")


def fleet_apply(file: Path = typer.Argument(..., help="The fleet file")) -> None:
    """Store a fleet file so that the services use it (local stack or deployed project)."""
    from datetime import datetime, timezone

    from tpuq.fleetstore import save_fleet

    model = validate_data(load_yaml_file(file), "fleet")
    version = save_fleet(cli_clients().firestore, model, datetime.now(timezone.utc))
    out.print(f"fleet {model.name!r} stored (version {version})")
