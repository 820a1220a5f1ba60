"""How the CLI finds its backend: the environment's emulators, else a running dev stack's, else the project (ADC).

A running dev stack is found through the env file it publishes (tpuq.stackenv), never by importing tpuq_dev.devstack.
"""

from __future__ import annotations

import os

from tpuq.cli.console import CliError, one_line


def _reachable(hostport: str) -> bool:
    import socket

    host, _, port = hostport.replace("http://", "").rstrip("/").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def cli_clients():
    """Clients for the CLI: the environment's emulators, else a running dev stack's, else production (ADC)."""
    from tpuq.clients import Clients, Settings
    from tpuq.stackenv import StackError, load_env

    env = dict(os.environ)
    if not any(k in env for k in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")):
        try:
            local = load_env()
        except StackError:
            local = {}
        if local:
            env.update(local)
            os.environ.update(local)
    for key in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST"):
        if env.get(key) and not _reachable(env[key]):
            raise CliError(f"the local stack is not running ({key}={env[key]} does not answer): start it with `tpuq dev up`")
    if "FIRESTORE_EMULATOR_HOST" not in env:
        _check_credentials()
    return Clients(Settings.from_env(env))


def _check_credentials() -> None:
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


def job_or_fail(db, job_id: str) -> dict:
    from tpuq.queries import UnknownJob, get_job

    try:
        return get_job(db, job_id)
    except UnknownJob as e:
        raise CliError(str(e)) from None
