"""Fleet and job files: reading and checking them (`tpuq validate`, `tpuq init`, and every command taking a file)."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from pydantic import ValidationError
from rich.markup import escape

from tpuq.cli.console import CliError, err, out
from tpuq.errors import describe_validation_error


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


def validate(file: Path = typer.Argument(..., help="A fleet file or a job.yaml")) -> None:
    """Check a fleet or job file and say what is wrong, field by field."""
    data = load_yaml_file(file)
    kind = detect_kind(data)
    model = validate_data(data, kind)
    if kind == "fleet":
        for note in model.transport_notes():
            err.print(f"[yellow]warning[/yellow]: {escape(note)}", soft_wrap=True)
        out.print(f"[green]ok[/green]: fleet {model.name!r} with {len(model.tpus)} TPU entr{'y' if len(model.tpus) == 1 else 'ies'}")
    else:
        out.print(f"[green]ok[/green]: {len(model.jobs)} job{'s' if len(model.jobs) != 1 else ''}")


def init(directory: Path = typer.Argument(Path("."), help="Where to write fleet.yaml and job.yaml"),
         force: bool = typer.Option(False, "--force", help="Overwrite existing files"),
         local: bool = typer.Option(False, "--local", help="Only a job.yaml that runs on `tpuq dev up`'s stack as it is")) -> None:
    """Write example fleet and job files, with comments."""
    from tpuq.examples import EXAMPLE_FLEET, EXAMPLE_JOB, local_job

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
    out.print("next: edit them, then `tpuq validate fleet.yaml` and `tpuq submit job.yaml`")
