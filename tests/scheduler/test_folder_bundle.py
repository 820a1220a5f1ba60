"""A job file uploaded to submit/ with `bundle: .`: the scheduler packs the folder within its memory (issue 32 §5).

The scheduler runs with 512 MiB (infra/services.yaml) on Cloud Run, whose file system is in memory. It used to
download the folder into /tmp and build the whole tarball in memory, then copy it: a folder of a few hundred MiB
killed the instance. The handler runs here in a subprocess under that limit (RLIMIT_AS: everything the process maps
counts), on fake-gcs-server.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.executor.conftest import fake_gcs  # noqa: F401 - the session's fake-gcs-server
from tests.scheduler.upload_under_memory_limit import run_upload

HELPER = Path(__file__).with_name("upload_under_memory_limit.py")
SERVICES_YAML = Path(__file__).parents[2] / "infra" / "services.yaml"
JOB = "jobs:\n  - name: packed\n    tpu: v4-8\n    bundle: .\n    command: sh run.sh\n"
MIB = 1024**2


def scheduler_memory_bytes() -> int:
    spec = next(s for s in yaml.safe_load(SERVICES_YAML.read_text())["services"] if s["name"] == "scheduler")
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", spec["memory"]).groups()
    return int(number) * {"Mi": MIB, "Gi": 1024 * MIB}[unit]


@pytest.fixture
def gcs(fake_gcs):  # noqa: F811
    return storage.Client(project="test", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": fake_gcs.base_url})


@pytest.fixture
def bucket(gcs, fake_gcs):  # noqa: F811
    return gcs.bucket(fake_gcs.create_bucket(f"runner-{uuid.uuid4().hex[:10]}"))


def run_handler(fake_gcs, bucket, job_file: str) -> dict:  # noqa: F811
    # One malloc arena: RLIMIT_AS counts address space, and each thread's arena reserves 64 MiB of it unused.
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    proc = subprocess.run([sys.executable, str(HELPER), str(scheduler_memory_bytes()), fake_gcs.base_url, bucket.name,
                           job_file], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def put_large(bucket, name: str, size: int) -> None:
    """A `size`-byte object of zeros, composed server-side from one 8 MiB piece (a few MiB cross the wire)."""
    piece = bucket.blob(f"pieces/{uuid.uuid4().hex}")
    piece.upload_from_string(bytes(8 * MIB))
    count, rest = divmod(size, 8 * MIB)
    assert rest == 0 and count <= 32, "compose takes at most 32 sources"
    bucket.blob(name).compose([piece] * count)


def bundle_members(gcs, uri: str) -> dict[str, int]:
    bucket_name, name = uri.removeprefix("gs://").split("/", 1)
    data = gcs.bucket(bucket_name).blob(name).download_as_bytes()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m.size for m in tar.getmembers()}


def test_a_folder_larger_than_memory_allows_to_hold_is_packed_under_the_schedulers_limit(fake_gcs, gcs, bucket):  # noqa: F811
    """256 MiB of data: held twice over (the tar, then its copy) it does not fit in 512 MiB with the interpreter."""
    folder = f"submit/{uuid.uuid4().hex[:8]}/"
    bucket.blob(folder + "run.sh").upload_from_string("echo packed\n")
    put_large(bucket, folder + "data/zeros-a.bin", 128 * MIB)
    put_large(bucket, folder + "data/zeros-b.bin", 128 * MIB)
    bucket.blob(folder + "job.yaml").upload_from_string(JOB)

    outcome = run_handler(fake_gcs, bucket, folder + "job.yaml")

    assert outcome.get("error") is None and outcome["result"] and "job_ids" in outcome["result"], outcome
    # Resident memory and /tmp together, as Cloud Run counts them: well inside the limit, whatever the folder's size.
    assert outcome["peak_bytes"] < scheduler_memory_bytes() // 2, outcome
    assert outcome["peak_tmp_bytes"] == 0, outcome
    bundles = [b.name for b in gcs.list_blobs(bucket.name, prefix="tpuq/bundles/")]
    assert len(bundles) == 1 and re.fullmatch(r"tpuq/bundles/[0-9a-f]{64}\.tar\.gz", bundles[0]), bundles
    members = bundle_members(gcs, f"gs://{bucket.name}/{bundles[0]}")
    assert members == {"data": 0, "data/zeros-a.bin": 128 * MIB, "data/zeros-b.bin": 128 * MIB,
                       "job.yaml": len(JOB), "run.sh": len("echo packed\n")}


def test_a_folder_over_the_limit_is_refused_with_its_size_and_the_limit_in_the_result_file(fake_gcs, gcs, bucket,  # noqa: F811
                                                                                         monkeypatch):
    from tpuq.scheduler import folder_bundle

    monkeypatch.setattr(folder_bundle, "MAX_FOLDER_BYTES", 8 * MIB)  # in-process: the limit, smaller
    folder = f"submit/{uuid.uuid4().hex[:8]}/"
    put_large(bucket, folder + "weights.bin", 8 * MIB)
    bucket.blob(folder + "job.yaml").upload_from_string(JOB)
    total = 8 * MIB + len(JOB)

    outcome = run_upload(fake_gcs.base_url, bucket.name, folder + "job.yaml")

    error = outcome["result"]["error"]
    assert error.startswith("jobs[0].bundle: ") and f"gs://{bucket.name}/{folder}" in error, error
    assert f"{total} bytes" in error and f"{8 * MIB} bytes" in error and "tpuq submit" in error, error
    assert "job_ids" not in outcome["result"]
    assert list(gcs.list_blobs(bucket.name, prefix="tpuq/bundles/")) == []  # nothing was read or written


def test_the_packed_folder_is_the_bundle_tpuq_submit_makes_of_the_same_directory(gcs, bucket, tmp_path):
    """Same rules, same bytes: ignore files at the root, ignored folders pruned, folders implied by the names."""
    from tpuq.contracts.bundle import make_bundle
    from tpuq.scheduler.folder_bundle import pack_folder

    files = {".tpuqignore": b"*.log\ncache/\n", ".tpu-runnerignore": b"scratch\n", "run.sh": b"python train.py\n",
             "train.py": b"print('hi')\n" * 50, "pkg/mod/a.py": b"A = 1\n", "pkg/b.log": b"noise",
             "cache/big.bin": b"x" * 1000, "out/scratch/tmp.txt": b"t", "out/keep.txt": b"k",
             "only-ignored/c.log": b"c"}
    folder = "submit/exp/"
    for name, data in files.items():
        bucket.blob(folder + name).upload_from_string(data)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    blobs = list(bucket.list_blobs(prefix=folder))

    uri = pack_folder(gcs, bucket.name, folder, blobs, [f"gs://{bucket.name}"], "tpuq/bundles/packing/t.tar.gz")

    expected = make_bundle(tmp_path)
    assert uri == f"gs://{bucket.name}/{expected.object_name}"
    assert bucket.blob(expected.object_name).download_as_bytes() == expected.data
    assert not bucket.blob("tpuq/bundles/packing/t.tar.gz").exists()
    # A second packing of the same content finds the bundle there (does-not-exist precondition).
    assert pack_folder(gcs, bucket.name, folder, blobs, [f"gs://{bucket.name}"], "tpuq/bundles/packing/u.tar.gz") == uri
