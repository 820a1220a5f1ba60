"""`tpuq deploy`: read the project, plan, print, and (without --dry-run) apply."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from tpuq.deploy.infra import INFRA_DIR, load_infra
from tpuq.deploy.plan import Action, ProjectState, Target, plan
from tpuq.fleet import FleetFile


def _adc_available() -> bool:
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
    todos = [a for a in actions if a.verb == "todo"]
    if todos:
        console.print("\n[bold yellow]for a person to do (tpuq does not do these):[/bold yellow]", highlight=False)
        for a in todos:
            console.print(f"  {a}", highlight=False, markup=False)


def run_deploy(fleet: FleetFile, console, *, dry_run: bool, region: str, firestore_location: str | None,
               image_tag: str, skip_services: bool, offline: bool, infra_dir: Path | None,
               adapters_factory: Callable[[str], dict[str, Any]] | None = None, as_json: bool = False) -> int:
    from tpuq.deploy import gcp

    target = Target(fleet=fleet, region=region, firestore_location=firestore_location, image_tag=image_tag)
    infra = load_infra(target.variables(), infra_dir or INFRA_DIR)
    notes: list[str] = []
    adapters = None
    if dry_run and (offline or (adapters_factory is None and not _adc_available())):
        state = ProjectState()
        if not offline:
            notes.append("no Google Cloud credentials found (gcloud auth application-default login): "
                         "the plan assumes an empty project")
    else:
        adapters = (adapters_factory or gcp.project_adapters)(fleet.project)
        state, read_notes = gcp.read_state(adapters, target, infra)
        notes += read_notes
    actions = plan(target, infra, state, skip_services=skip_services)
    if as_json:  # the exact requests, one JSON object a line (checked against Google's discovery documents)
        for action in actions:
            for line in gcp.wire_requests(action):
                sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
        return 0
    print_plan(console, actions, notes, state, dry_run)
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
