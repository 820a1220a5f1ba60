"""`tpuq deploy` and `tpuq undeploy`: the option parsing; the work is tpuq.deploy.cli's."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tpuq.cli.console import CliError, out
from tpuq.cli.files import load_yaml_file, validate_data


def deploy(fleet_file: Path = typer.Argument(..., help="The fleet file (its project is the one deployed to)"),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; change nothing"),
           region: str = typer.Option("us-central1", help="Region of the Cloud Run services, Scheduler job and images"),
           firestore_location: Optional[str] = typer.Option(None, help="Firestore location (default: the fleet file's firestore_location, else --region)"),
           image_tag: str = typer.Option("latest", help="Tag of the service images to run (cloudbuild.yaml: $BUILD_ID)"),
           skip_services: bool = typer.Option(False, "--skip-services",
                                              help="Everything but the services and what pushes to them (first pass)"),
           offline: bool = typer.Option(False, "--offline", help="With --dry-run: plan against an empty project, "
                                                                 "without reading it"),
           infra_dir: Optional[Path] = typer.Option(None, help="The infra/ directory (default: the one installed with tpuq)"),
           as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the exact requests, one JSON "
                                                             "object a line: {method, url, query, body}")) -> None:
    """Enable the APIs, then create or update everything in infra/ for the fleet's project, idempotently."""
    from tpuq.deploy.cli import run_deploy

    if as_json and not dry_run:
        raise CliError("--json prints the requests a deploy would send: use it with --dry-run")
    fleet = validate_data(load_yaml_file(fleet_file), "fleet")
    try:
        code = run_deploy(fleet, out, dry_run=dry_run, region=region, firestore_location=firestore_location,
                          image_tag=image_tag, skip_services=skip_services, offline=offline, infra_dir=infra_dir,
                          as_json=as_json)
    except ValueError as e:  # InfraError, a malformed infra/ file
        raise CliError(str(e)) from None
    raise typer.Exit(code)


def undeploy(fleet_file: Path = typer.Argument(..., help="The fleet file that was deployed"),
             purge: bool = typer.Option(False, "--purge", help="Also delete the runner bucket, the image repository "
                                                               "and tpuq's Firestore data"),
             dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed; change nothing"),
             region: str = typer.Option("us-central1", help="Region the services were deployed to"),
             yes: bool = typer.Option(False, "--yes", help="Do not ask before removing"),
             as_json: bool = typer.Option(False, "--json", help="With --dry-run: the exact requests, one JSON object a line"),
             infra_dir: Optional[Path] = typer.Option(None, help="The infra/ directory (default: the one installed with tpuq)")) -> None:
    """Remove what `tpuq deploy` created, and nothing it did not; buckets and Firestore data stay unless --purge."""
    import sys

    from tpuq.deploy.cli import adc_available, run_undeploy

    fleet = validate_data(load_yaml_file(fleet_file), "fleet")
    if as_json and not dry_run:
        raise CliError("--json prints the requests an undeploy would send: use it with --dry-run")
    if not (dry_run or yes or sys.stdin.isatty()):
        raise CliError("undeploy removes resources: pass --yes to run it without a prompt (or --dry-run to look first)")
    if not adc_available():
        raise CliError("undeploy reads the project to find what tpuq created: no Google Cloud credentials found "
                       "(run: gcloud auth application-default login)")
    confirm = None if yes else (lambda question: typer.confirm(question, default=False))
    try:
        code = run_undeploy(fleet, out, dry_run=dry_run, purge=purge, region=region, infra_dir=infra_dir,
                            as_json=as_json, confirm=confirm)
    except ValueError as e:  # InfraError, a malformed infra/ file
        raise CliError(str(e)) from None
    raise typer.Exit(code)
