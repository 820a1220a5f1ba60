"""`tpuq deploy`: read the project, plan, print, and (without --dry-run) apply."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from tpuq.deploy.infra import INFRA_DIR, load_infra
from tpuq.deploy.model import Action, ProjectState, Target
from tpuq.deploy.plan import plan
from tpuq.contracts.fleet import FleetFile


def adc_available() -> bool:
    """Credentials that need no probe of the metadata server: an ADC file, or running on Google Cloud."""
    from google.auth import _cloud_sdk

    return bool(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
                or os.path.exists(_cloud_sdk.get_application_default_credentials_path())
                or os.environ.get("K_SERVICE") or os.environ.get("BUILD_ID") or os.environ.get("CLOUD_BUILD"))


def print_plan(console, actions: list[Action], notes: list[str], state: ProjectState, dry_run: bool) -> None:
    title = "plan (dry run: nothing is changed)" if dry_run else "plan"
    console.print(f"[bold]{title}[/bold]", highlight=False)
    if not state.known:
        console.print("  (the project was not read: planned as if it were empty)", highlight=False)
    for note in notes:
        console.print(f"  note: {note}", highlight=False, markup=False)
    doing = [a for a in actions if a.verb not in ("todo",)]
    for a in doing:
        console.print(f"  {a}", highlight=False, markup=False)
    if not any(a.sends for a in actions):
        console.print("  nothing to change: the project already matches infra/", highlight=False)
    _print_section(console, "[bold yellow]for a person to do (tpuq does not do these):[/bold yellow]",
                   [a for a in actions if a.verb == "todo"])


def _print_section(console, title: str, actions: list[Action]) -> None:
    if actions:
        console.print(f"\n{title}", highlight=False)
        for a in actions:
            console.print(f"  {a}", highlight=False, markup=False)


def _print_requests(actions: list[Action]) -> None:
    """The exact requests, one JSON object a line (tests check each against Google's discovery documents)."""
    from tpuq.deploy import gcp

    for action in actions:
        for line in gcp.wire_requests(action):
            sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")


def run_deploy(fleet: FleetFile, console, *, dry_run: bool, region: str, firestore_location: str | None,
               image_tag: str, skip_services: bool, offline: bool, infra_dir: Path | None,
               adapters_factory: Callable[[str], dict[str, Any]] | None = None, as_json: bool = False) -> int:
    from tpuq.deploy import gcp

    target = Target(fleet=fleet, region=region, firestore_location=firestore_location, image_tag=image_tag)
    infra = load_infra(target.variables(), infra_dir or INFRA_DIR)
    notes: list[str] = []
    adapters = None
    if dry_run and (offline or (adapters_factory is None and not adc_available())):
        state = ProjectState()
        if not offline:
            notes.append("no Google Cloud credentials found (gcloud auth application-default login): "
                         "the plan assumes an empty project")
    else:
        adapters = (adapters_factory or gcp.project_adapters)(fleet.project)
        state, read_notes = gcp.read_state(adapters, target, infra)
        notes += read_notes
    actions = plan(target, infra, state, skip_services=skip_services)
    if as_json:
        _print_requests(actions)
        return 0
    print_plan(console, actions, notes, state, dry_run)
    if state.billing_enabled is False:
        console.print(f"[red]error:[/red] billing is disabled on project {fleet.project} (Cloud Billing: "
                      "billingEnabled false): Cloud Run and the TPU API refuse to work without it; enable billing, "
                      "then run `tpuq deploy` again", highlight=False)
        return 1
    if dry_run:
        return 0
    if not state.project_number:
        console.print("[red]error:[/red] could not read the project number of "
                      f"{fleet.project}: is the Cloud Resource Manager API enabled and may you read the project?")
        return 1
    assert adapters is not None
    sent = gcp.apply(actions, adapters, echo=lambda line: console.print(f"  {line}", highlight=False, markup=False))
    console.print(f"[green]deployed[/green]: {sent} change{'s' if sent != 1 else ''} to {fleet.project}", highlight=False)
    return 0


# ---------------------------------------------------------------- undeploy
OBJECTS_SHOWN = 5


def print_undeploy_plan(console, actions: list[Action], notes: list[str], dry_run: bool) -> None:
    console.print(f"[bold]{'undeploy plan (dry run: nothing is changed)' if dry_run else 'undeploy plan'}[/bold]",
                  highlight=False)
    for note in notes:
        console.print(f"  note: {note}", highlight=False, markup=False)
    removing = [a for a in actions if a.sends]
    objects = [a for a in removing if a.what.startswith("object gs://")]
    for a in removing:
        if a in objects[OBJECTS_SHOWN:]:
            continue
        console.print(f"  {a}", highlight=False, markup=False)
        if objects and a is objects[min(OBJECTS_SHOWN, len(objects)) - 1] and len(objects) > OBJECTS_SHOWN:
            console.print(f"  ... and {len(objects) - OBJECTS_SHOWN} more objects", highlight=False)
    if not removing:
        console.print("  nothing to remove: the project holds nothing tpuq deploy created", highlight=False)
    _print_section(console, "[bold]kept:[/bold]", [a for a in actions if a.verb == "keep"])


def run_undeploy(fleet: FleetFile, console, *, dry_run: bool, purge: bool, region: str, infra_dir: Path | None,
                 as_json: bool = False, confirm: Callable[[str], bool] | None = None,
                 adapters_factory: Callable[[str], dict[str, Any]] | None = None) -> int:
    """Read the project, plan the removal of what deploy created, print it, and (unless a dry run) apply it."""
    from tpuq.deploy import gcp
    from tpuq.deploy.undeploy import owns_bucket, undeploy_plan

    target = Target(fleet=fleet, region=region)
    infra = load_infra(target.variables(), infra_dir or INFRA_DIR)
    adapters = (adapters_factory or gcp.project_adapters)(fleet.project)
    state, notes = gcp.read_state(adapters, target, infra)
    if purge and owns_bucket(target, state):
        state.bucket_objects[target.runner_bucket] = gcp.read_bucket_objects(adapters["storage"], target.runner_bucket)
    actions = undeploy_plan(target, infra, state, purge=purge)
    if as_json:
        _print_requests(actions)
        return 0
    print_undeploy_plan(console, actions, notes, dry_run)
    count = sum(a.sends for a in actions)
    if dry_run or not count:
        return 0
    if confirm is not None and not confirm(f"make the {count} change{'s' if count != 1 else ''} listed above to {fleet.project}?"):
        console.print("nothing removed", highlight=False)
        return 1
    sent = gcp.apply(actions, adapters, echo=lambda line: console.print(f"  {line}", highlight=False, markup=False))
    console.print(f"[green]undeployed[/green]: {sent} change{'s' if sent != 1 else ''} to {fleet.project}",
                  highlight=False)
    return 0
