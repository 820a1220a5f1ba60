"""`tpuq submit`'s checks of the job's buckets, with the bucket reads injected (the local stack has no IAM)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from tpuq.contracts.bundle import BundleError
from tpuq.contracts.jobspec import JobFile
from tpuq.operations.submit import check_buckets, job_bucket_names, may_write, prepare

WORKER = "tpuq-worker@p.iam.gserviceaccount.com"
HINT = ("the workers' account tpuq-worker@p.iam.gserviceaccount.com cannot write gs://{0}; run: gcloud storage "
        "buckets add-iam-policy-binding gs://{0} --member=serviceAccount:tpuq-worker@p.iam.gserviceaccount.com "
        "--role=roles/storage.objectAdmin")


def prepared(tmp_path: Path, *jobs: dict):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"jobs": list(jobs)}))
    return prepare(job_file, JobFile.model_validate({"jobs": list(jobs)}), "gs://runner-bkt", random.Random(0))


def test_every_bucket_is_checked_once_and_a_gs_bundles_bucket_only_for_existence(tmp_path):
    p = prepared(tmp_path, {"tpu": "v4-8", "command": "x", "buckets": ["gs://eu-data-europe-west4", "gs://us-data-us-east1"]},
                 {"tpu": "v4-8", "command": "x", "buckets": ["gs://eu-data-europe-west4"],
                  "bundle": "gs://bundles-bkt/b.tar.gz"})
    assert job_bucket_names(p) == (["eu-data-europe-west4", "us-data-us-east1", "bundles-bkt"],
                                   ["eu-data-europe-west4", "us-data-us-east1"])


def test_a_missing_bucket_is_one_error_line_and_its_policy_is_not_read(tmp_path):
    p = prepared(tmp_path, {"tpu": "v4-8", "command": "x", "buckets": ["gs://gone-us-east1", "gs://here-us-central2"]})
    read = []
    errors, warnings = check_buckets(p, lambda name: name != "gone-us-east1",
                                     lambda name: read.append(name) or [], WORKER)
    assert errors == ["bucket gs://gone-us-east1 does not exist: create it (gcloud storage buckets create "
                      "gs://gone-us-east1 --location=us-east1) or name an existing bucket in the job's `buckets`"]
    assert read == ["here-us-central2"] and warnings == [HINT.format("here-us-central2")]


def test_in_a_file_of_several_jobs_a_missing_bucket_names_the_jobs_using_it(tmp_path):
    p = prepared(tmp_path, {"name": "train", "tpu": "v4-8", "command": "x", "buckets": ["gs://here-us-east1"]},
                 {"name": "eval", "tpu": "v4-8", "command": "x", "buckets": ["gs://gone-us-east1"]},
                 {"id": "probe-1", "tpu": "v4-8", "command": "x", "bundle": "gs://gone-us-east1/b.tar.gz"})
    errors, _ = check_buckets(p, lambda name: name != "gone-us-east1", None, WORKER)
    assert errors == ["jobs[1] (eval), jobs[2] (probe-1): bucket gs://gone-us-east1 does not exist: create it "
                      "(gcloud storage buckets create gs://gone-us-east1 --location=us-east1) or name an existing "
                      "bucket in the job's `buckets`"]


def test_a_bucket_the_workers_may_write_gives_no_warning(tmp_path):
    p = prepared(tmp_path, {"tpu": "v4-8", "command": "x", "buckets": ["gs://ok-us-east1"]})
    policy = [{"role": "roles/storage.objectViewer", "members": ["allUsers"]},
              {"role": "roles/storage.objectAdmin", "members": [f"serviceAccount:{WORKER}", "user:me@example.com"]}]
    assert check_buckets(p, lambda name: True, lambda name: policy, WORKER) == ([], [])


def test_an_unreadable_policy_or_the_emulator_says_nothing(tmp_path):
    p = prepared(tmp_path, {"tpu": "v4-8", "command": "x", "buckets": ["gs://ok-us-east1"]})
    assert check_buckets(p, lambda name: True, lambda name: None, WORKER) == ([], [])
    assert check_buckets(p, lambda name: True, None, WORKER) == ([], [])


def test_reading_is_not_writing():
    assert not may_write([{"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{WORKER}"]}], WORKER)
    assert not may_write([{"role": "roles/storage.objectAdmin", "members": ["serviceAccount:other@p.iam.gserviceaccount.com"]}],
                         WORKER)
    assert may_write([{"role": "roles/storage.legacyBucketWriter", "members": [f"serviceAccount:{WORKER}"]}], WORKER)


def test_a_missing_bundle_folder_is_named_as_the_files_entry(tmp_path):
    with pytest.raises(BundleError, match=r"^jobs\[1\]\.bundle: .*/nonexistent is not a directory$"):
        prepared(tmp_path, {"tpu": "v4-8", "command": "x"},
                 {"tpu": "v4-8", "command": "x", "bundle": "./nonexistent"})
