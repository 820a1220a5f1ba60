"""`tpuq config`: where the CLI talks to and as whom: backend, project (and where it came from), emulator hosts,
buckets, fleet, the owner it records on jobs. A diagnosis: what it cannot find is a line saying why, not an error."""

from __future__ import annotations

import json

import typer

from tpuq.cli.console import out


def describe(backend, fleet_lookup, runner_bucket_lookup, owner: str) -> dict:
    """The view `tpuq config` prints (pure: the lookups are passed in)."""
    from tpuq.runtime.settings import ENV_RUNNER_BUCKET
    from tpuq.operations.stackenv import EMULATOR_HOSTS

    view: dict = {"backend": backend.kind, "line": backend.line, "project": backend.project,
                  "project_source": backend.project_source, "owner": owner}
    if backend.state_dir:
        view["state_dir"] = backend.state_dir
    view["emulators"] = {k: backend.env[k] for k in EMULATOR_HOSTS if backend.env.get(k)}
    if not backend.emulated:
        view["account"] = backend.account
    if backend.env.get(ENV_RUNNER_BUCKET):
        bucket = backend.env[ENV_RUNNER_BUCKET]
        view["runner_bucket"] = bucket if bucket.startswith("gs://") else f"gs://{bucket}"
        view["runner_bucket_source"] = ENV_RUNNER_BUCKET
    else:
        view["runner_bucket"], view["runner_bucket_source"] = runner_bucket_lookup()
    fleet, fleet_note = fleet_lookup()
    view["fleet"] = fleet.name if fleet else None
    view["fleet_note"] = fleet_note
    view["job_buckets"] = list(fleet.job_buckets) if fleet else []
    view["notes"] = list(backend.notes)
    return view


def _fleet_lookup(db):
    from tpuq.cli.console import one_line
    from tpuq.contracts.errors import TpuqError
    from tpuq.cli.connecting import fleet_in_use
    from tpuq.runtime.fleetstore import load_fleet
    from tpuq.runtime.settings import ENV_FLEET

    try:
        fleet = load_fleet(db, fleet_in_use())
    except TpuqError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a diagnosis goes on: say what failed
        return None, f"could not read the stored fleets: {one_line(e)}"
    named = fleet_in_use()
    return fleet, f"{ENV_FLEET}={named}" if named else "the only fleet stored"


def config(as_json: bool = typer.Option(False, "--json", help="Machine-readable output")) -> None:
    """Where the CLI talks to: the local stack or a project (and where the project came from), emulator
    hosts, the runner and job buckets, the fleet, and the owner it records on the jobs you submit."""
    from tpuq.cli import connecting
    from tpuq.cli.identity import current_owner
    from tpuq.runtime.clients import Clients
    from tpuq.runtime.settings import Settings

    backend = connecting.find_backend(check_credentials=False)
    connecting.CURRENT = backend
    clients = Clients(Settings.from_env(backend.env))
    usable = backend.emulated or backend.credentials is not None
    no_access = (None, "not read: no credentials")
    view = describe(backend, (lambda: _fleet_lookup(clients.firestore)) if usable else (lambda: no_access),
                    (lambda: connecting.runner_bucket_of(clients.firestore, backend.project)) if usable
                    else (lambda: no_access), current_owner())
    if as_json:
        print(json.dumps(view, indent=2))
        return
    for line in config_lines(view):
        out.print(line, highlight=False, markup=False)


def config_lines(view: dict) -> list[str]:
    lines = [f"backend: {view['line']}", f"project: {view['project']} (from {view['project_source']})"]
    if view.get("state_dir"):
        lines.append(f"state: {view['state_dir']}")
    for key, value in view["emulators"].items():
        lines.append(f"{key}: {value}")
    if "account" in view:
        lines.append(f"credentials: {view['account'] or 'account unknown'}")
    lines.append(f"owner of the jobs you submit: {view['owner']}")
    lines.append(f"runner bucket: {view['runner_bucket'] or '-'} ({view['runner_bucket_source']})")
    lines.append(f"fleet: {view['fleet'] or '-'} ({view['fleet_note']})")
    if view["job_buckets"]:
        lines.append(f"job buckets: {', '.join(view['job_buckets'])}")
    lines.extend(f"note: {n}" for n in view["notes"])
    return lines
