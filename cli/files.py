"""Fleet and job files: reading and checking them (`tpuq validate`, `tpuq init`, and every command taking a file)."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from pydantic import ValidationError
from rich.markup import escape

from tpuq.cli.console import CliError, err, out
from tpuq.contracts import yamltext
from tpuq.contracts.errors import describe_validation_error


def load_yaml_file(path: Path) -> object:
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a directory, expected a YAML file")
    try:
        return yamltext.load(path.read_text())
    except yaml.YAMLError as e:
        raise CliError(f"{path}: {yamltext.error_text(e)}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file") from None


def not_a_mapping(data: object) -> str:
    """What to say of a file whose top level is not a mapping (`key: value` lines)."""
    if data is None:
        return "the file is empty: a job file has `jobs:` (or one job's `command:`), a fleet file `tpus:`"
    kind = {list: "a list", str: "one line of text", int: "a number", float: "a number",
            bool: "true or false"}.get(type(data), f"a {type(data).__name__}")
    return f"expected `key: value` lines at the top level (a YAML mapping), got {kind}"


def detect_kind(data: object) -> str:
    """"fleet" (a tpuq fleet file or a tpu-runner deployment.yaml: `tpus:`) or "job" (`jobs:`, or one job)."""
    if isinstance(data, dict) and "tpus" in data:
        return "fleet"
    if isinstance(data, dict) and ("jobs" in data or "command" in data):
        return "job"
    if not isinstance(data, dict):
        raise CliError(not_a_mapping(data))
    from tpuq.contracts.fieldnames import did_you_mean, known_fields
    from tpuq.contracts.fleet import FleetFile
    from tpuq.contracts.jobspec import JobSpec

    # A key neither kind knows, close to one of the three that say the kind (`tpu:` is a job's own: not a hint).
    known = {*known_fields(JobSpec, ()), *known_fields(FleetFile, ())}
    misspelt = {key: did_you_mean(key, ["jobs", "command", "tpus"]) for key in data
                if isinstance(key, str) and key not in known}
    hint = "".join(f"; `{key}:` looks like `{meant}:`" for key, meant in misspelt.items() if meant)
    raise CliError("neither a job file nor a fleet file: a job file has `jobs:` (or one job's `command:`), a fleet "
                   f"file or a tpu-runner deployment.yaml has `tpus:`, and this file has neither{hint}")


def read_fleet_data(data: object):
    """The fleet of a tpuq fleet file or a tpu-runner deployment file (tpuq.operations.tpurunner.FleetRead)."""
    from tpuq.contracts.errors import Permanent
    from tpuq.operations.tpurunner import is_runner_file, read_fleet

    if not isinstance(data, dict):
        raise CliError(not_a_mapping(data))
    kind = "tpu-runner deployment" if is_runner_file(data) else "fleet"
    try:
        return read_fleet(data)
    except ValidationError as e:
        from tpuq.contracts.fleet import FleetFile

        # A tpu-runner file's names are not FleetFile's: no suggestion from its fields for them.
        _, reason = describe_validation_error(e, model=FleetFile if kind == "fleet" else None)
        raise CliError(f"invalid {kind} file: {reason}") from None
    except Permanent as e:
        raise CliError(f"invalid {kind} file: {e}") from None


def validate_data(data: object, kind: str):
    from tpuq.contracts.jobspec import JobFile

    if kind == "fleet":
        return read_fleet_data(data).fleet
    if not isinstance(data, dict):
        raise CliError(not_a_mapping(data))
    try:
        return JobFile.model_validate(data)
    except ValidationError as e:
        _, reason = describe_validation_error(e, model=JobFile)
        raise CliError(f"invalid {kind} file: {reason}") from None


def validate(files: list[Path] = typer.Argument(..., metavar="FILE...", help="Fleet files, tpu-runner deployment.yaml "
                                                                          "files or job.yaml files")) -> None:
    """Check fleet, tpu-runner deployment or job files and say what is wrong, field by field. Given a fleet and a
    job file together, also whether the fleet would run the jobs: their buckets under its job_buckets, an
    ssh_key_secret named."""
    checked = []
    for file in files:
        data = load_yaml_file(file)
        kind = detect_kind(data)
        checked.append((file, kind, _report_valid(data, kind, file)))
    fleets = [(f, model) for f, kind, model in checked if kind == "fleet"]
    jobs = [(f, model) for f, kind, model in checked if kind == "job"]
    _multislice_warnings(fleets, jobs)
    if jobs and not fleets:
        _checked_alone()
    if fleets and jobs:
        from tpuq.contracts.fleetjobs import fleet_job_warnings

        for fleet_file, fleet in fleets:
            for job_file, job_model in jobs:
                for warning in fleet_job_warnings(fleet, job_model):
                    err.print(f"[yellow]warning[/yellow]: {escape(f'{job_file} with {fleet_file}: {warning}')}",
                              soft_wrap=True)


def _multislice_warnings(fleets, jobs) -> None:
    """Multislice jobs (issue 37): whether some fleet entry could hold each one's gang."""
    from datetime import datetime, timezone

    from tpuq.scheduler.multislice_fit import validate_lines

    for job_file, job_model in jobs:
        for fleet_file, fleet in fleets or [(None, None)]:
            where = f"{job_file} with {fleet_file}" if fleet_file else f"{job_file}"
            for line in validate_lines(fleet, job_model, datetime.now(timezone.utc)):
                err.print(f"[yellow]warning[/yellow]: {escape(f'{where}: {line}')}", soft_wrap=True)


def validate_fleet(file: Path = typer.Argument(Path("deployment.yaml"), help="A fleet or tpu-runner deployment file")) -> None:
    """tpu-runner's name for `tpuq validate` on a fleet (deployment) file."""
    _report_valid(load_yaml_file(file), "fleet", file)


def validate_jobs(file: Path = typer.Argument(Path("job.yaml"), help="A job.yaml")) -> None:
    """tpu-runner's name for `tpuq validate` on a job file."""
    _report_valid(load_yaml_file(file), "job", file)
    _checked_alone()


def _checked_alone() -> None:
    """`ok` for job files alone must not read as "submit will take them": the fleet decides what it can run."""
    err.print("note: the jobs were checked on their own, not against a fleet or its buckets: `tpuq validate "
              "fleet.yaml job.yaml` checks them with a fleet file, `tpuq submit` with the fleet in force",
              soft_wrap=True, highlight=False, markup=False)


def _report_valid(data: object, kind: str, file: Path):
    """Print what the file is, its notes and warnings; the fleet or job file read. A job file's local bundle
    folders must be there (relative to the file), as `tpuq submit` needs them."""
    if kind == "fleet":
        read = read_fleet_data(data)
        for note in read.notes:
            err.print(f"note: {escape(note)}", soft_wrap=True, highlight=False)
        for warning in read.warnings:
            err.print(f"[yellow]warning[/yellow]: {escape(warning)}", soft_wrap=True)
        model = read.fleet
        what = "tpu-runner deployment file, read as fleet" if read.kind == "tpu-runner" else "fleet"
        out.print(f"[green]ok[/green]: {what} {model.name!r} with {len(model.tpus)} TPU "
                  f"entr{'y' if len(model.tpus) == 1 else 'ies'}")
    else:
        from tpuq.operations.submit import missing_bundle_folders

        model = validate_data(data, kind)
        missing = missing_bundle_folders(file, model)
        if missing:
            raise CliError("invalid job file: " + "; ".join(missing))
        out.print(f"[green]ok[/green]: {len(model.jobs)} job{'s' if len(model.jobs) != 1 else ''}")
    return model


def init(directory: Path = typer.Argument(Path("."), help="Where to write fleet.yaml and job.yaml"),
         force: bool = typer.Option(False, "--force", help="Overwrite existing files"),
         local: bool = typer.Option(False, "--local", help="Only a job.yaml that runs on `tpuq dev up`'s stack as it is")) -> None:
    """Write example fleet and job files, with comments."""
    from tpuq.operations.examples import EXAMPLE_FLEET, EXAMPLE_JOB, local_job

    directory.mkdir(parents=True, exist_ok=True)
    files = (("job.yaml", local_job()),) if local else (("fleet.yaml", EXAMPLE_FLEET), ("job.yaml", EXAMPLE_JOB))
    for name, text in files:
        path = directory / name
        if path.exists() and not force:
            raise CliError(f"{path} already exists (use --force to overwrite)")
        path.write_text(text)
        out.print(f"wrote {path}")
    if local:
        out.print(f"next: `tpuq dev up` (if it is not running), then `tpuq submit {directory / 'job.yaml'} --wait`")
        return
    out.print("next: edit them, then `tpuq validate fleet.yaml job.yaml` and `tpuq submit job.yaml`")
