"""A bucket folder packed as a job's bundle (`bundle: .` in a job file uploaded to submit/), streamed from GCS to GCS.

Streamed because of where the scheduler runs: Cloud Run, with 512 MiB (infra/services.yaml), where the container's
file system is in memory and what is written there counts against that limit ("Container runtime contract",
filesystem: https://cloud.google.com/run/docs/container-contract#filesystem). Downloading the folder into /tmp and
building the tarball in memory held it two or three times over, and a folder of a few hundred MiB killed the
instance with every request on it. Here each object is read in CHUNK_BYTES ranges into tar, gzip and a resumable
upload of CHUNK_BYTES chunks: the memory a packing needs does not grow with the folder.

The tarball's name is its content's sha256 (`tpuq.contracts.bundle.bundle_object_name`), known only once it is written, so
it is uploaded under a temporary name in the folder's bucket, copied server-side (rewrite) to that name in each of
the job's buckets, and the temporary object deleted.

MAX_FOLDER_BYTES bounds what this path packs: it runs inside the push of the object's notification, which Pub/Sub
waits for 60 s (the gcs-submit subscription's ack deadline, tpuq.contracts.topology) before delivering it again, on one vCPU
that gzips incompressible data at about 40 MB/s. A larger folder is refused before any of it is read, and the
result file says how large it is and what the limit is: `tpuq submit` packs on the user's machine (up to
tpuq.contracts.bundle.MAX_BUNDLE_BYTES), or the job reads its data from a bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from google.api_core.exceptions import NotFound as GcsNotFound, PreconditionFailed

from tpuq.contracts.bundle import (IGNORE_FILE, RUNNER_IGNORE_FILE, BundleError, bundle_object_name, ignore_rules,
                                   object_members, write_bundle)
from tpuq.contracts.errors import NotFound, missing_bucket_line
from tpuq.contracts.jobspec import split_gs_uri

MAX_FOLDER_BYTES = 512 * 1024**2
CHUNK_BYTES = 8 * 1024**2  # a resumable upload's chunks are multiples of 256 KiB
IGNORE_FILE_MAX_BYTES = 1024**2
PACKING_PREFIX = "tpuq/bundles/packing/"


def _mib(n: int) -> str:
    return f"{n / 1024**2:.0f} MiB"


def too_large(uri: str, total: int, limit: int | None = None) -> str | None:
    """Why the folder is not packed here, or None when its objects fit the limit (MAX_FOLDER_BYTES)."""
    limit = MAX_FOLDER_BYTES if limit is None else limit
    if total <= limit:
        return None
    return (f"{uri} holds {_mib(total)} ({total} bytes); the scheduler packs a folder of at most {_mib(limit)} "
            f"({limit} bytes). Submit the job with `tpuq submit`, which packs the folder on your machine, or leave "
            f"large data out of the folder ({IGNORE_FILE}) and have the job read it from a bucket")


def packing_name(*identity: str) -> str:
    """The temporary object a packing writes: the same for one upload's folder, so a redelivery overwrites it."""
    return PACKING_PREFIX + hashlib.sha256("#".join(identity).encode()).hexdigest()[:32] + ".tar.gz"


def _text(blob) -> str | None:
    if blob is None:
        return None
    if int(blob.size or 0) > IGNORE_FILE_MAX_BYTES:
        raise BundleError(f"bundle: {blob.name} is larger than {_mib(IGNORE_FILE_MAX_BYTES)}")
    return blob.download_as_bytes(if_generation_match=blob.generation).decode(errors="replace")


def pack_folder(storage, bucket_name: str, folder: str, blobs: Sequence, targets: Sequence[str],
                temp_name: str) -> str:
    """Pack `blobs` (the folder's objects, as `bucket.list_blobs` gives them) into each target bucket (gs://NAME) as
    a content-named bundle; returns the first copy's gs:// URI. BundleError when the folder cannot be a bundle."""
    uri = f"gs://{bucket_name}/{folder}"
    problem = too_large(uri, sum(int(b.size or 0) for b in blobs))
    if problem:
        raise BundleError(problem)
    by_name = {b.name[len(folder):]: b for b in blobs}
    ignore = ignore_rules(_text(by_name.get(IGNORE_FILE)), _text(by_name.get(RUNNER_IGNORE_FILE)))
    members = object_members(
        ((name, int(b.size or 0),
          lambda b=b: b.open("rb", chunk_size=CHUNK_BYTES, if_generation_match=b.generation))
         for name, b in by_name.items()), ignore)
    source = storage.bucket(bucket_name)
    temp = source.blob(temp_name, chunk_size=CHUNK_BYTES)
    try:
        with temp.open("wb", content_type="application/gzip", ignore_flush=True) as out:
            packed = write_bundle(members, out)  # the tar stays under MAX_BUNDLE_BYTES, as tpuq submit's
        name = bundle_object_name(packed.sha256)
        for target in targets:
            _copy(storage, temp, target, name)
    finally:
        try:
            temp.delete()
        except GcsNotFound:
            pass  # never written, or a concurrent copy of this delivery deleted it
    return f"{targets[0]}/{name}"


def _copy(storage, temp, target: str, name: str) -> None:
    """Server-side copy (rewrite, which also crosses locations and storage classes) unless the bundle is there."""
    bucket_name, _ = split_gs_uri(target)
    dest = storage.bucket(bucket_name).blob(name)
    token = None
    try:
        while True:
            token, _, _ = dest.rewrite(temp, token=token, if_generation_match=0)
            if token is None:
                return
    except PreconditionFailed:
        return  # same content, same name: already there
    except GcsNotFound:
        raise NotFound(missing_bucket_line(bucket_name, None)) from None
