"""`tpuq init`'s fleet and job work together as written (issue 32 §7b): the fleet grants every bucket the job uses and
names the executor's key secret, and `tpuq validate fleet.yaml job.yaml` says when a pair does not fit."""

from __future__ import annotations

import os
import subprocess

import yaml

from tpuq.deploy.plan import _ssh_secret_commands
from tpuq.operations.examples import EXAMPLE_FLEET, EXAMPLE_JOB
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.fleetjobs import fleet_job_warnings
from tpuq.contracts.jobspec import JobFile



def tpuq(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


def test_the_init_fleet_and_job_validate_together_without_a_word_about_buckets_or_the_key(tmp_path):
    assert tpuq("init", str(tmp_path), cwd=tmp_path).returncode == 0
    r = tpuq("validate", "fleet.yaml", "job.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ok: fleet 'research'" in r.stdout and "ok: 1 job" in r.stdout
    fit = [w for w in warnings_of(r) if "job_buckets" in w or "ssh_key_secret" in w]
    assert fit == [], r.stderr


def test_a_job_bucket_the_fleet_does_not_grant_and_a_fleet_without_a_key_are_warned(tmp_path):
    fleet = {**yaml.safe_load(EXAMPLE_FLEET), "job_buckets": ["gs://my-training-us-central2"]}
    del fleet["ssh_key_secret"]
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    (tmp_path / "job.yaml").write_text(EXAMPLE_JOB)
    r = tpuq("validate", "fleet.yaml", "job.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # warnings, not errors: the grant may have been made by hand
    fit = [w for w in warnings_of(r) if "job_buckets" in w or "ssh_key_secret" in w]
    assert len(fit) == 2, r.stderr
    assert "job.yaml with fleet.yaml: job train lists gs://my-training-us-east1, which fleet research's job_buckets " \
           "does not name" in fit[0]
    assert "add gs://my-training-us-east1 to job_buckets" in fit[0]
    assert "names no ssh_key_secret: tpuq deploy then deploys no executor" in fit[1]
    alone = tpuq("validate", "job.yaml", cwd=tmp_path)  # a job file alone says nothing of any fleet
    assert alone.returncode == 0 and warnings_of(alone) == []
    # ... but says it was not checked against one: its `ok` is not "submit takes it"
    assert "not against a fleet or its buckets" in alone.stderr and "tpuq validate fleet.yaml job.yaml" in alone.stderr


def test_a_bundle_read_from_an_ungranted_bucket_is_warned():
    fleet = FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET))
    jobs = JobFile.model_validate({"jobs": [{"name": "eval", "tpu": "v4-32", "buckets": ["gs://my-training-us-central2"],
                                             "bundle": "gs://shared-code/bundles/x.tar.gz", "command": "true"}]})
    (line,) = fleet_job_warnings(fleet, jobs)
    assert line.startswith("job eval reads its bundle from gs://shared-code, which fleet research's job_buckets")


def test_the_init_fleet_says_how_to_make_the_key_secret_as_deploy_would():
    """The commands in the comment are deploy's own todo commands for that secret: one source, no key in the file."""
    fleet = FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET))
    for command in _ssh_secret_commands(fleet.ssh_key_secret, fleet.project):
        assert f"# {command}\n" in EXAMPLE_FLEET
    assert "PRIVATE KEY" not in EXAMPLE_FLEET
