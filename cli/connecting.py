"""How the CLI finds its backend: the environment's emulators, else a running dev stack's, else the project (ADC).

A running dev stack is found through the env file it publishes (tpuq.operations.stackenv), never by importing tpuq_dev.devstack.
The project comes from `--project`, else `GOOGLE_CLOUD_PROJECT`, else `gcloud config get-value project`
(`resolve_project`). Commands that talk to a backend say which on one dim line on stderr (`Backend.line`);
`tpuq config` shows it in full (tpuq.cli.config).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuq.cli.accounts import account_of, gcloud_config_value
from tpuq.cli.console import CliError, err, one_line

# How the backend was found (Backend.kind).
LOCAL_STACK, EMULATORS, PROJECT = "local stack", "emulators", "project"
LOCAL_PROJECT = "tpuq-local"  # Settings' default: the emulators accept any project id


@dataclass
class CliOptions:
    """The options every command shares (`tpuq --project P ...`), set by the app's callback."""

    project: str | None = None


OPTIONS = CliOptions()


@dataclass
class Backend:
    """Where this command talks to, and as whom."""

    kind: str  # LOCAL_STACK, EMULATORS or PROJECT
    env: dict[str, str]  # what Settings are made from
    project: str
    project_source: str  # --project, GOOGLE_CLOUD_PROJECT, gcloud config, ...
    state_dir: str | None = None  # the local stack's
    credentials: Any = None  # google.auth credentials (PROJECT only), refreshed
    account: str | None = None  # whose they are, when they say (tpuq.cli.accounts.account_of)
    notes: list[str] = field(default_factory=list)

    @property
    def emulated(self) -> bool:
        return self.kind != PROJECT

    @property
    def line(self) -> str:
        """The one line commands print on stderr (dim): where they talk to."""
        if self.kind == LOCAL_STACK:
            return f"local stack in {self.state_dir} (project {self.project})"
        if self.kind == EMULATORS:
            return f"emulators at Firestore {self.env.get('FIRESTORE_EMULATOR_HOST')} (project {self.project})"
        who = f" as {self.account}" if self.account else ""
        return f"project {self.project} (from {self.project_source}){who}"


def resolve_project(option: str | None, env: dict[str, str], emulated: bool,
                    gcloud_project: Callable[[], str | None]) -> tuple[str, str]:
    """(project, where it came from): --project, else GOOGLE_CLOUD_PROJECT (or GCLOUD_PROJECT), else on the
    emulators tpuq-local, else `gcloud config get-value project` (asked only then). No project: CliError."""
    from tpuq.runtime.settings import ENV_PROJECT

    if option:
        return option, "--project"
    for key in (ENV_PROJECT, "GCLOUD_PROJECT"):
        if env.get(key):
            return env[key], key
    if emulated:
        return LOCAL_PROJECT, "the default of the emulators"
    found = gcloud_project()
    if found:
        return found, "gcloud config"
    raise CliError(f"no Google Cloud project: pass --project P, set {ENV_PROJECT}, or run "
                   "`gcloud config set project P` (or start the local stack with `tpuq dev up`)")


def _reachable(hostport: str) -> bool:
    import socket

    host, _, port = hostport.replace("http://", "").rstrip("/").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def find_backend(check_credentials: bool = True) -> Backend:
    """The environment's emulators, else a running dev stack's, else the project with ADC. A shell holding an
    earlier stack's `dev env` is told to evaluate it again; a stack that is not running, or missing credentials,
    is a CliError. `check_credentials=False` (tpuq config): credentials problems become notes."""
    from tpuq.operations.stackenv import (EMULATOR_HOSTS, ENV_STACK_DIR, ENV_STACK_ID, default_state_dir, read_running_env,
                                          stale_env_problem)

    env = dict(os.environ)
    if env.get(ENV_STACK_DIR):
        problem = stale_env_problem(env, read_running_env(Path(env[ENV_STACK_DIR])))
        if problem:
            raise CliError(problem)
    if not any(k in env for k in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")):
        local = read_running_env(default_state_dir())
        if local:
            env.update(local)
            os.environ.update(local)
    for key in EMULATOR_HOSTS:
        if env.get(key) and not _reachable(env[key]):
            raise CliError(f"the local stack is not running ({key}={env[key]} does not answer): start it with `tpuq dev up`")
    emulated = "FIRESTORE_EMULATOR_HOST" in env
    kind = (LOCAL_STACK if env.get(ENV_STACK_ID) else EMULATORS) if emulated else PROJECT
    project, source = resolve_project(OPTIONS.project, env, emulated, lambda: gcloud_config_value("project"))
    env["GOOGLE_CLOUD_PROJECT"] = project
    backend = Backend(kind, env, project, source, state_dir=env.get(ENV_STACK_DIR) if kind == LOCAL_STACK else None)
    if not emulated:
        try:
            backend.credentials = _check_credentials()
        except CliError as e:
            if check_credentials:
                raise
            backend.notes.append(str(e))
        else:
            backend.account = account_of(backend.credentials)
    return backend


def fleet_in_use() -> str | None:
    """The fleet a command acts on when it names none: $TPUQ_FLEET, else (None) the only fleet stored."""
    from tpuq.runtime.settings import ENV_FLEET

    return os.environ.get(ENV_FLEET) or None


def cli_clients():
    """Clients for the CLI: the environment's emulators, else a running dev stack's, else production (ADC).
    Says on one dim line on stderr where it talks to, when stderr is a terminal (`tpuq config` says it always)."""
    from tpuq.runtime.clients import Clients
    from tpuq.runtime.settings import Settings

    global CURRENT
    backend = find_backend()
    clients = Clients(Settings.from_env(backend.env))
    if not clients.settings.runner_bucket:
        clients.settings.runner_bucket, _ = runner_bucket_of(clients.firestore, backend.project)
    CURRENT = backend
    if err.is_terminal:  # for the person at the terminal; piped stderr (scripts, CI) keeps only what went wrong
        err.print(backend.line, style="dim", highlight=False, markup=False)
    return clients


CURRENT: Backend | None = None  # the backend cli_clients found last (this process runs one command)


def runner_bucket_of(db, project: str) -> tuple[str | None, str]:
    """The runner bucket of the deployed fleet, without TPUQ_RUNNER_BUCKET: the stored fleet's `runner_bucket`,
    else the name `tpuq deploy` gives it (tpuq.deploy.model.Target). (None, why) without a stored fleet."""
    from tpuq.deploy.model import Target
    from tpuq.contracts.errors import TpuqError
    from tpuq.runtime.fleetstore import load_fleet

    try:
        fleet = load_fleet(db, fleet_in_use())
    except TpuqError as e:
        return None, f"none: {e}"
    except Exception as e:  # noqa: BLE001 - no access to Firestore yet: the command itself will say so
        return None, f"unknown: {one_line(e)}"
    name = f"gs://{Target(fleet=fleet).runner_bucket}"
    return name, f"fleet {fleet.name}" + ("" if fleet.runner_bucket else " (deploy's default name)")


def _check_credentials():
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError

    try:
        credentials, _ = google.auth.default()
        if not credentials.valid:
            from google.auth.transport.requests import Request

            credentials.refresh(Request())
    except DefaultCredentialsError:
        raise CliError("no Google Cloud credentials: run `gcloud auth application-default login` "
                       "(or start the local stack with `tpuq dev up`)") from None
    except RefreshError as e:
        raise CliError(f"your Google Cloud credentials have expired or were revoked ({one_line(e)}): "
                       "run `gcloud auth application-default login`") from None
    except TransportError:
        raise CliError("could not refresh your Google Cloud credentials: Google's token service is out of reach "
                       "(no network?)") from None
    return credentials


def job_or_fail(db, job_id: str) -> dict:
    from tpuq.operations.queries import UnknownJob, get_job

    try:
        return get_job(db, job_id)
    except UnknownJob as e:
        raise CliError(str(e)) from None
