"""The fleet commands: the fleet view, `fleet unblock`, `fleet apply`, and the brakes: `fleet pause`, `resume`,
`drain --now`. The brakes write `fleet_control/{fleet}` (`tpuq.runtime.fleetstore`) and publish a tick so the services act
at once; the janitor does every delete of a drain, and this command reports what it deleted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tpuq.cli.connecting import cli_clients, fleet_in_use
from tpuq.cli.files import load_yaml_file, validate_data
from tpuq.cli.console import out
from tpuq.cli.views import json_default, print_fleet
from tpuq.operations.jobs import nudge


def fleet(ctx: typer.Context, name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)"),
          as_json: bool = typer.Option(False, "--json"),
          verbose: bool = typer.Option(False, "--verbose", "-v", help="Also the API's own error behind each "
                                                                      "blocked reason")) -> None:
    """Queued resources, TPUs, states, idle times and blocked reasons."""
    if ctx.invoked_subcommand is not None:
        return
    from datetime import datetime, timezone

    from tpuq.capacity.cloudchecks import reader_from_settings
    from tpuq.operations.fleetreport import fleet_view, unheld_jobs
    from tpuq.operations.notifyhealth import failing_view

    clients = cli_clients()
    now = datetime.now(timezone.utc)
    view = fleet_view(clients.firestore, name or fleet_in_use(), now, local_zone(), reader_from_settings(clients.settings))
    view["unheld_jobs"] = unheld_jobs(clients.firestore, now)
    view["notify_failing"] = failing_view(clients.firestore, now)
    if as_json:
        print(json.dumps(view, default=json_default, indent=2))
        return
    print_fleet(view, verbose)
    for destination in view["notify_failing"]:  # last: what a person has to fix
        out.print(destination["line"], highlight=False, markup=False, soft_wrap=True)


def local_zone():
    """The machine's local time zone: `tpuq fleet` and waiting jobs show times in it (`14:03 CET`)."""
    from datetime import datetime

    return datetime.now().astimezone().tzinfo


def fleet_pause(name: Optional[str] = typer.Argument(None, metavar="FLEET", help="Fleet name (default: the only one)")) -> None:
    """No new claims. Running jobs finish; idle TPUs are deleted at once. `tpuq fleet resume` undoes it."""
    import os
    from datetime import datetime, timezone

    from tpuq.runtime.fleetstore import load_fleet, set_paused

    clients = cli_clients()
    fleet_name = load_fleet(clients.firestore, name or fleet_in_use()).name
    set_paused(clients.firestore, fleet_name, True, datetime.now(timezone.utc), os.environ.get("USER"))
    nudge(clients, "pause")
    out.print(f"fleet {fleet_name!r} paused: nothing new is claimed or started; running jobs finish; idle TPUs "
              "are deleted now (tpuq fleet resume undoes it)")


def fleet_resume(name: Optional[str] = typer.Argument(None, metavar="FLEET", help="Fleet name (default: the only one)")) -> None:
    """Claim and start jobs again after `tpuq fleet pause` or `drain`."""
    from datetime import datetime, timezone

    from tpuq.runtime.fleetstore import load_control, load_fleet, set_paused

    clients = cli_clients()
    fleet_name = load_fleet(clients.firestore, name or fleet_in_use()).name
    if not load_control(clients.firestore, fleet_name).paused:
        out.print(f"fleet {fleet_name!r} is not paused")
        return
    set_paused(clients.firestore, fleet_name, False, datetime.now(timezone.utc))
    nudge(clients, "resume")
    out.print(f"fleet {fleet_name!r} resumed: claiming again")


def fleet_drain(name: Optional[str] = typer.Argument(None, metavar="FLEET", help="Fleet name (default: the only one)"),
                now_: bool = typer.Option(False, "--now", help="Required: cancel running jobs and delete now"),
                timeout: float = typer.Option(300.0, min=1, help="Seconds to wait for the janitor's deletes")) -> None:
    """Cancel running jobs, then delete every queued resource and TPU tpuq owns in the fleet; leaves it paused."""
    import os
    import time
    import uuid
    from datetime import datetime, timezone

    from tpuq.cli.console import CliError, err
    from tpuq.runtime.fleetstore import load_control, load_fleet, request_drain, set_paused
    from tpuq.contracts.messages import CancelRequest
    from tpuq.operations.queries import jobs_on_fleet

    if not now_:
        raise CliError("drain: add --now (it cancels the running jobs and deletes every queued resource and TPU "
                       "tpuq owns in the fleet; `tpuq fleet pause` only stops new claims)")
    clients = cli_clients()
    db = clients.firestore
    fleet_name = load_fleet(db, name or fleet_in_use()).name
    user = os.environ.get("USER")
    set_paused(db, fleet_name, True, datetime.now(timezone.utc), user)  # first: nothing new starts meanwhile
    for job_id in jobs_on_fleet(db, fleet_name):
        clients.publish("cancels", CancelRequest(job_id=job_id, reason="tpuq fleet drain --now", requested_by=user))
        out.print(f"cancelled job {job_id}")
    drain_id = uuid.uuid4().hex[:12]
    request_drain(db, fleet_name, drain_id, datetime.now(timezone.utc), user)
    deadline = time.monotonic() + timeout
    nudged = 0.0
    with err.status("the janitor is deleting what tpuq owns..."):
        while True:
            control = load_control(db, fleet_name)
            if control.drain_id != drain_id or not control.drain_pending or time.monotonic() > deadline:
                break
            if time.monotonic() - nudged > 5:
                nudge(clients, "drain")
                nudged = time.monotonic()
            time.sleep(0.5)
    for deleted in control.drain_deleted:
        out.print(f"deleted {deleted}")
    if control.drain_id != drain_id:
        raise CliError(f"another drain of {fleet_name!r} was asked for meanwhile ({control.drain_id})")
    if control.drain_pending:
        raise CliError(f"drain of {fleet_name!r} not finished after {timeout:.0f}s (a PROVISIONING request can only "
                       "be deleted once it leaves PROVISIONING); the janitor goes on at every tick: run it again "
                       "to see the rest")
    if not control.drain_deleted:
        out.print("nothing of tpuq's was left to delete")
    out.print(f"fleet {fleet_name!r} drained and paused (tpuq fleet resume to claim again)")


def fleet_unblock(name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)")) -> None:
    """After fixing billing, permissions, quota or a region's subnet: let the claimer create again (clears the
    project-level block and the zones dropped for want of quota or of the fleet's subnet)."""
    from google.cloud.firestore import FieldFilter

    from tpuq.contracts import store
    from tpuq.contracts.documents import target_from_doc
    from tpuq.runtime.deltaread import stamped
    from tpuq.runtime.fleetstore import load_fleet

    clients = cli_clients()
    db = clients.firestore
    fleet = load_fleet(db, name or fleet_in_use())
    fleet_name = fleet.name
    dropped = [t for s in db.collection(store.ZONES).where(filter=FieldFilter("fleet", "==", fleet_name)).stream()
               if (t := target_from_doc(s.to_dict(), s.update_time)).dropped(fleet.version)]
    for t in dropped:
        # Only the drop's two fields: the claimer may be writing the target's back-off meanwhile.
        db.collection(store.ZONES).document(store.doc_id(t.fleet, t.zone, t.type)).update(
            stamped({"dropped_version": None, "dropped_reason": None}))  # the claimers' views see the change
        out.print(f"zone {t.zone} {t.type} may be claimed again (was: {t.dropped_reason})", highlight=False, markup=False)
    ref = db.collection(store.FLEET_STATUS).document(fleet_name)
    snap = ref.get()
    if not snap.exists or not (snap.to_dict() or {}).get("blocked"):
        if not dropped:
            out.print(f"fleet {fleet_name!r} is not blocked")
        return
    ref.delete()
    out.print(f"fleet {fleet_name!r} unblocked (was: {snap.to_dict()['blocked']})", highlight=False, markup=False)


def fleet_apply(file: Path = typer.Argument(..., help="The fleet file")) -> None:
    """Store a fleet file so that the services use it (local stack or deployed project)."""
    from datetime import datetime, timezone

    from tpuq.cli.console import CliError
    from tpuq.operations.notifysecrets import has_inline_urls, store_inline_urls
    from tpuq.runtime.fleetstore import save_fleet
    from tpuq.runtime.secretmanager import SecretError, SecretManager
    from tpuq.runtime.settings import ENV_FLEET

    model = validate_data(load_yaml_file(file), "fleet")
    clients = cli_clients()
    # The services read the fleet named by their TPUQ_FLEET (the local stack's env, a deployed service's setting)
    # afresh for every message: a file under that name changes what they do; under another name it would not.
    in_use = fleet_in_use()
    if in_use and in_use != model.name:
        raise CliError(f"{file}: fleet {model.name!r} would not be used: the services use fleet {in_use!r} "
                       f"({ENV_FLEET}); nothing stored. Set `name: {in_use}` in the file to change it, or start the "
                       f"local stack with `tpuq dev up --fleet {file}` (a project: `tpuq deploy {file}`)")
    if has_inline_urls(model.notify):  # a webhook URL is a credential: only its secret's name is stored
        secrets = SecretManager(clients.settings.project, endpoint=clients.settings.secretmanager_endpoint)
        try:
            model = model.model_copy(update={"notify": store_inline_urls(model.notify, secrets, model.project)})
        except SecretError as e:
            raise CliError(f"{file}: notify: a webhook URL could not be stored in Secret Manager: {e}; nothing "
                           "stored") from None
    version = save_fleet(clients.firestore, model, datetime.now(timezone.utc))
    nudge(clients, "fleet-apply")  # jobs blocked for want of an entry are looked at again now
    out.print(f"fleet {model.name!r} stored (version {version}); the services use it from their next message")
