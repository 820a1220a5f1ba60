"""The CLI's pure parts for issue 16 (items 13-15, 17): which project and as whom, a stale `dev env`, the owner a
job records and who may cancel it, the job table's text; and, with `tpuq` subprocesses and no stack, the project's
order (`--project`, `GOOGLE_CLOUD_PROJECT`, then a stand-in `gcloud` on PATH) and shell completion."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tpuq.cli.connecting import Backend, resolve_project, runner_bucket_of
from tpuq.cli.console import CliError
from tpuq.cli.accounts import account_of
from tpuq.cli.identity import owner
from tpuq.cli.views import job_table_rows, plain_table
from tpuq.operations.jobs import cancel_refusal, shown_reason
from tpuq.contracts.documents import JobDoc, JobState
from tpuq.contracts.errors import Permanent
from tpuq.executor.outcome import all_workers
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryFirestore
from tpuq.contracts.jobspec import PublishedJob
from tpuq.contracts.messages import OWNER_ATTRIBUTE, message_owner
from tpuq.scheduler.intake import job_document
from tpuq.operations.stackenv import ENV_STACK_DIR, ENV_STACK_ID, stale_env_problem

NOW = datetime(2026, 12, 1, 12, 30, tzinfo=timezone.utc)


def no_gcloud():
    raise AssertionError("gcloud asked although the project was already known")


@pytest.mark.parametrize("option, env, emulated, gcloud, expected", [
    ("flag", {"GOOGLE_CLOUD_PROJECT": "env"}, False, no_gcloud, ("flag", "--project")),
    (None, {"GOOGLE_CLOUD_PROJECT": "env"}, False, no_gcloud, ("env", "GOOGLE_CLOUD_PROJECT")),
    (None, {"GCLOUD_PROJECT": "old"}, False, no_gcloud, ("old", "GCLOUD_PROJECT")),
    (None, {}, False, lambda: "cfg", ("cfg", "gcloud config")),
    (None, {}, True, no_gcloud, ("tpuq-local", "the default of the emulators")),
])
def test_the_project_comes_from_the_flag_then_the_environment_then_gcloud(option, env, emulated, gcloud, expected):
    assert resolve_project(option, env, emulated, gcloud) == expected


def test_no_project_anywhere_says_the_three_ways():
    with pytest.raises(CliError, match="--project P, set GOOGLE_CLOUD_PROJECT, or run `gcloud config set project P`"):
        resolve_project(None, {}, False, lambda: None)


SHELL = {ENV_STACK_ID: "s1", ENV_STACK_DIR: "/state", "FIRESTORE_EMULATOR_HOST": "127.0.0.1:1",
         "PUBSUB_EMULATOR_HOST": "127.0.0.1:2"}


@pytest.mark.parametrize("shell, running, expected", [
    (SHELL, {**SHELL}, None),  # the stack it names, still running
    ({k: v for k, v in SHELL.items() if k != ENV_STACK_ID}, None, None),  # not from `dev env`: nothing to say
    ({ENV_STACK_ID: "s1", ENV_STACK_DIR: "/state"}, None, None),  # no emulator in the shell: the CLI reads the file
    (SHELL, None, "was stopped: start one with `tpuq dev up`, then run `eval \"$(tpuq dev env)\"`"),
    (SHELL, {**SHELL, ENV_STACK_ID: "s2"}, "from an earlier `tpuq dev up`"),
    (SHELL, {**SHELL, "FIRESTORE_EMULATOR_HOST": "127.0.0.1:7"}, "FIRESTORE_EMULATOR_HOST is 127.0.0.1:7 now"),
])
def test_a_stale_dev_env_is_told_to_evaluate_again(shell, running, expected):
    problem = stale_env_problem(shell, running)
    if expected is None:
        assert problem is None
    else:
        assert expected in problem and 'eval "$(tpuq dev env)"' in problem


def id_token(claims: dict) -> str:
    def part(d):
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256'})}.{part(claims)}.sig"


@pytest.mark.parametrize("credentials, expected", [
    (SimpleNamespace(service_account_email="sa@p.iam.gserviceaccount.com"), "sa@p.iam.gserviceaccount.com"),
    (SimpleNamespace(service_account_email="default"), None),  # the metadata server's, before a refresh
    (SimpleNamespace(account="me@example.com", id_token=None), "me@example.com"),
    (SimpleNamespace(account="", id_token=id_token({"email": "you@example.com", "sub": "1"})), "you@example.com"),
    (SimpleNamespace(account="", id_token="not a jwt"), None),
    (SimpleNamespace(), None),
])
def test_the_account_of_the_credentials(credentials, expected):
    assert account_of(credentials) == expected


@pytest.mark.parametrize("emulated, account, env, gcloud, expected", [
    (True, None, {"TPUQ_OWNER": "alice"}, no_gcloud, "alice"),
    (True, None, {}, no_gcloud, "os-user"),
    (False, "me@example.com", {"TPUQ_OWNER": "alice"}, no_gcloud, "me@example.com"),  # a project: the credentials
    (False, None, {}, lambda: "cfg@example.com", "cfg@example.com"),
    (False, None, {}, lambda: None, "os-user"),
])
def test_who_the_cli_says_submits(emulated, account, env, gcloud, expected):
    assert owner(emulated, account, env, gcloud, lambda: "os-user") == expected


@pytest.mark.parametrize("job_owner, me, force, refused", [
    ("alice", "alice", False, False), (None, "alice", False, False), ("bob", "alice", True, False),
    ("bob", "alice", False, True),
])
def test_cancelling_someone_elses_job_needs_force(job_owner, me, force, refused):
    why = cancel_refusal("j1", job_owner, me, force)
    assert bool(why) is refused
    if refused:
        assert why == "j1 was submitted by bob, not you (alice): tpuq cancel --force j1 cancels it anyway"


@pytest.mark.parametrize("attributes, expected", [
    ({}, None), ({OWNER_ATTRIBUTE: "  "}, None), ({OWNER_ATTRIBUTE: "carol@example.com"}, "carol@example.com"),
])
def test_the_owner_attribute_of_a_jobs_message(attributes, expected):
    assert message_owner(attributes) == expected


@pytest.mark.parametrize("bad", ["x" * 255, "a\nb", "tab\there"])
def test_a_malformed_owner_attribute_is_refused_naming_the_field(bad):
    with pytest.raises(Permanent, match="owner: ") as e:
        message_owner({OWNER_ATTRIBUTE: bad})
    assert e.value.field == "owner"


def test_the_stored_job_records_its_owner():
    job = PublishedJob.model_validate({"id": "j1", "tpu": "v4-8", "command": "true"})
    doc = job_document(job, "j1", "cli", "m1", NOW, owner="alice")
    assert JobDoc.from_doc(doc).owner == "alice"


def row(job_id: str, state: JobState, **extra) -> dict:
    return {"id": job_id, "state": state.value, "priority": "normal", "spec": {"tpu": ["v4-8"]},
            "submit_time": NOW - timedelta(seconds=30), **extra}


def test_the_job_table_keeps_names_whole_and_drops_a_reason_that_repeats_the_state():
    long_id = "a-rather-long-job-name-that-a-width-80-table-would-fold-in-the-middle-x"
    rows = job_table_rows([row(long_id, JobState.succeeded, reason="succeeded", owner="alice@example.com"),
                           row("j2", JobState.failed, reason="worker 0 exited 7\nlast lines ...")], NOW)
    assert rows[0] == (long_id, "succeeded", "normal", "v4-8", "alice@example.com", "30s", "")
    assert rows[1][-1] == "worker 0 exited 7"  # the first line only
    assert rows[1][4] == "unknown"  # published with no identity: as `tpuq status` says it
    text = plain_table(("job", "state", "priority", "tpu", "owner", "age", "reason"), rows).splitlines()
    assert len(text) == 3 and text[1].startswith(long_id + "  succeeded")


@pytest.mark.parametrize("state, reason, shown", [
    (JobState.succeeded, "succeeded", None), (JobState.cancelled, "cancelled by user", "cancelled by user"),
    (JobState.failed, None, None),
])
def test_shown_reason(state, reason, shown):
    assert shown_reason(JobDoc.from_doc({"id": "j", "state": state.value, "reason": reason})) == shown


@pytest.mark.parametrize("count, said", [(1, "the 1 worker"), (4, "all 4 workers")])
def test_all_workers_wording(count, said):
    assert all_workers(count) == said


@pytest.mark.parametrize("runner_bucket, expected", [
    ("gs://lab-runner", ("gs://lab-runner", "fleet f1")),
    (None, ("gs://p-tpuq-runner", "fleet f1 (deploy's default name)")),
])
def test_the_runner_bucket_comes_from_the_deployed_fleet(runner_bucket, expected):
    db = MemoryFirestore()
    assert runner_bucket_of(db, "p")[0] is None  # nothing deployed yet
    data = {"name": "f1", "project": "p", "tpus": [{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"]}]}
    save_fleet(db, FleetFile.model_validate({**data, "runner_bucket": runner_bucket}), NOW)
    assert runner_bucket_of(db, "p") == expected


def test_the_backend_line():
    local = Backend("local stack", {}, "tpuq-local", "GOOGLE_CLOUD_PROJECT", state_dir="/s")
    assert local.line == "local stack in /s (project tpuq-local)"
    project = Backend("project", {}, "lab", "gcloud config", account="me@example.com")
    assert project.line == "project lab (from gcloud config) as me@example.com"


# ---- as a person runs it: subprocesses, no stack, a stand-in gcloud on PATH

STAND_IN_GCLOUD = """#!/bin/sh
echo "$*" >> "$GCLOUD_CALLS"
case "$*" in
  "config get-value project") [ -n "$STAND_IN_PROJECT" ] && echo "$STAND_IN_PROJECT" || echo "(unset)" >&2 ;;
  "config get-value account") echo someone@example.com ;;
esac
"""


def run_tpuq(tmp_path, *args, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gcloud").write_text(STAND_IN_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    base = {k: v for k, v in os.environ.items()
            if not k.endswith("_EMULATOR_HOST") and k not in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                                                             "CLOUDSDK_CORE_PROJECT", "TPUQ_RUNNER_BUCKET")
            and not k.startswith("TPUQ_DEV")}
    full = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TPUQ_DEV_DIR": str(tmp_path / "nostack"),
            "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-credentials.json"), "NO_GCE_CHECK": "True",
            "GCLOUD_CALLS": str(tmp_path / "calls"), "HOME": str(tmp_path / "home"), **env}
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=full, timeout=120)


@pytest.mark.parametrize("args, env, project, source", [
    (["--project", "from-flag"], {"GOOGLE_CLOUD_PROJECT": "from-env", "STAND_IN_PROJECT": "from-gcloud"},
     "from-flag", "--project"),
    ([], {"GOOGLE_CLOUD_PROJECT": "from-env", "STAND_IN_PROJECT": "from-gcloud"}, "from-env", "GOOGLE_CLOUD_PROJECT"),
    ([], {"STAND_IN_PROJECT": "from-gcloud"}, "from-gcloud", "gcloud config"),
])
def test_tpuq_config_names_the_project_and_where_it_came_from(tmp_path, args, env, project, source):
    done = run_tpuq(tmp_path, *args, "config", "--json", **env)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert (view["backend"], view["project"], view["project_source"]) == ("project", project, source)
    assert view["owner"] == "someone@example.com"  # no credentials: gcloud's account
    assert any("no Google Cloud credentials" in n for n in view["notes"]) and view["runner_bucket"] is None
    asked = (tmp_path / "calls").read_text().splitlines()
    assert ("config get-value project" in asked) is (source == "gcloud config")


def test_no_project_at_all_is_one_line(tmp_path):
    done = run_tpuq(tmp_path, "list")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["error: no Google Cloud project: pass --project P, set "
                                                "GOOGLE_CLOUD_PROJECT, or run `gcloud config set project P` (or "
                                                "start the local stack with `tpuq dev up`)"]


def test_shell_completion_installs_and_completes_commands_and_states(tmp_path):
    # The shell named, not detected from the parent processes (a CI runner's may hold no shell: "Shell None is not
    # supported"); typer's own switch for that, as its tests use it.
    installed = run_tpuq(tmp_path, "--install-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    script = tmp_path / "home" / ".bash_completions" / "tpuq.sh"
    assert script.exists() and str(script) in (tmp_path / "home" / ".bashrc").read_text()
    tpuq = subprocess.run(["which", "tpuq"], capture_output=True, text=True).stdout.strip()
    for words, cword, expected in (("tpuq sub", 1, "submit"), ("tpuq list --state ru", 3, "running")):
        shell = (f"source {script}; COMP_WORDS=({words}); COMP_CWORD={cword}; _tpuq_completion {tpuq}; "
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HOME": str(tmp_path / "home")})
        assert done.stdout.split() == [expected], done.stdout + done.stderr
