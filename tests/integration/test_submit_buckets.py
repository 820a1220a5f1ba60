"""`tpuq submit` against the local stack's fake GCS: a bucket that does not exist is one line, exit 1, and
nothing is uploaded or published; existing buckets submit (fake-gcs-server has no IAM: no policy check)."""

from __future__ import annotations

import json
import os
import subprocess

from tpuq.contracts import store


def submit(tmp_path, stack, job: dict) -> subprocess.CompletedProcess:
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "job.yaml").write_text(json.dumps({"jobs": [job]}))
    env = {**os.environ, **stack.env}
    env.pop("TPUQ_DEBUG", None)
    return subprocess.run(["tpuq", "submit", str(tmp_path / "job.yaml")], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_missing_bucket_is_one_line_and_nothing_is_sent(clean_stack, clients, tmp_path):
    job = {"id": "nobucket-1", "tpu": "v4-8", "bundle": ".", "command": "sh run.sh",
           "buckets": [{"uri": f"gs://{clean_stack.runner_bucket}", "region": "europe-west4"},
                       "gs://tpuq-nowhere-us-central2"]}
    r = submit(tmp_path, clean_stack, job)
    assert r.returncode == 1
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("error: bucket gs://tpuq-nowhere-us-central2 does not exist: "), line
    assert "gcloud storage buckets create gs://tpuq-nowhere-us-central2 --location=us-central2" in line
    assert f"the local stack has gs://{clean_stack.runner_bucket} (`tpuq dev up` makes one per region" in line
    assert "Traceback" not in r.stderr + r.stdout and "404" not in r.stderr
    assert not list(clients.storage.bucket(clean_stack.runner_bucket).list_blobs(prefix="tpuq/bundles/"))
    assert not clients.firestore.collection(store.JOBS).document("nobucket-1").get().exists


def test_existing_buckets_submit_without_a_policy_warning(clean_stack, tmp_path):
    job = {"id": "withbucket-1", "tpu": "v4-8", "bundle": ".", "command": "sh run.sh",
           "buckets": [{"uri": f"gs://{clean_stack.runner_bucket}", "region": "us-central2"}]}
    r = submit(tmp_path, clean_stack, job)
    assert r.returncode == 0, r.stderr
    assert "submitted withbucket-1" in r.stdout and "warning" not in r.stderr


def test_a_bucket_gone_between_the_check_and_the_upload_is_the_same_one_line(clean_stack, clients, tmp_path):
    """fake-gcs-server answers an upload to a missing bucket 404, as GCS does: never shown raw."""
    import pytest

    from tpuq.contracts.bundle import make_bundle
    from tpuq.contracts.errors import NotFound
    from tpuq.operations.submit import upload_bundle

    (tmp_path / "run.sh").write_text("echo hi\n")
    with pytest.raises(NotFound) as e:
        upload_bundle(clients.storage, make_bundle(tmp_path), ["gs://tpuq-gone-us-central2"])
    assert str(e.value).startswith("bucket gs://tpuq-gone-us-central2 does not exist: create it")
