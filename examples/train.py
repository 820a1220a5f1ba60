#!/usr/bin/env python3
"""A training loop that survives preemption: it checkpoints every N steps and on SIGTERM, and resumes from the last
checkpoint when it starts again. Runs unchanged on the local stack and on a TPU VM.

tpuq gives every attempt of a job the same CHECKPOINT_GCS_DIR, and says where the attempt stands:
TPUQ_ATTEMPT (1, 2, ...), TPUQ_PREEMPTIONS (before this attempt) and TPUQ_RESUMING=1 when an earlier attempt
started. On a preemption notice the worker's supervisor sends the job SIGTERM at once; a spot VM stops about 30 s
later, and tpuq sends SIGKILL after 25 s, so a save must fit in that (save often, and small, or asynchronously).
The signal reaches the whole process group: a periodic save under way when it comes dies with it, and is made
again.

    # job.yaml
    jobs:
      - tpu: v4-8
        bundle: examples
        command: python3 train.py --steps 1000 --checkpoint-every 50
        max_duration: 6h

The model is a stand-in (a line fitted by gradient descent, in pure Python); the checkpointing is the point.
Storage: the Cloud Storage client library (google-cloud-storage) when it is installed, else `gcloud storage`. Both
reach the local stack's fake GCS through STORAGE_EMULATOR_HOST (the library) or
CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE (gcloud). A checkpoint directory that is not gs:// is a local directory.
Only worker 0 (TPU_WORKER_ID) writes checkpoints; every worker reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

CHECKPOINT_NAME = "train-state.json"
EXIT_STOPPED = 128 + signal.SIGTERM  # saved and stopped on SIGTERM, as a shell reports a TERM'd process


# ------------------------------------------------------------------ storage


class LocalStore:
    def __init__(self, directory: str):
        self.directory = directory.removeprefix("file://")

    def read(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.directory, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, name)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)  # a reader sees the old checkpoint or the new one, never half of one


def split_gs(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    return bucket, prefix.strip("/")


class ClientStore:
    """google-cloud-storage. With STORAGE_EMULATOR_HOST set, the client talks to that endpoint without credentials."""

    def __init__(self, uri: str):
        from google.cloud import storage

        self.bucket_name, self.prefix = split_gs(uri)
        self.bucket = storage.Client().bucket(self.bucket_name)

    def _blob(self, name: str):
        return self.bucket.blob(f"{self.prefix}/{name}" if self.prefix else name)

    def read(self, name: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._blob(name).download_as_bytes()
        except NotFound:
            return None

    def write(self, name: str, data: bytes) -> None:
        self._blob(name).upload_from_string(data, content_type="application/json")  # one object: all or nothing


class GcloudStore:
    """`gcloud storage`, for a VM without the client library. The local stack's fake workers point it at fake GCS
    (CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE); given only STORAGE_EMULATOR_HOST, this sets that up itself."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.env = dict(os.environ)
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:  # an emulator takes no credentials, and a fresh VM has none to give
            self.env.setdefault("CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE", emulator.rstrip("/") + "/storage/v1/")
            self.env.setdefault("CLOUDSDK_AUTH_DISABLE_CREDENTIALS", "true")

    def read(self, name: str) -> bytes | None:
        out = subprocess.run(["gcloud", "storage", "cat", f"{self.uri}/{name}"], env=self.env, capture_output=True)
        if out.returncode != 0:
            if b"matched no objects" in out.stderr:  # no checkpoint yet (a missing bucket is an error)
                return None
            raise RuntimeError(f"gcloud storage cat failed ({out.returncode}): "
                               f"{out.stderr.decode(errors='replace').strip()}")
        return out.stdout

    def write(self, name: str, data: bytes) -> None:
        out = subprocess.run(["gcloud", "storage", "cp", "-", f"{self.uri}/{name}"], input=data, env=self.env,
                             capture_output=True)
        if out.returncode != 0:
            raise RuntimeError(f"gcloud storage cp failed ({out.returncode}): "
                               f"{out.stderr.decode(errors='replace').strip()}")


def open_store(where: str, prefer: str = "auto"):
    """The checkpoint store for `where` (gs://... or a directory). `prefer`: auto, client or gcloud."""
    if not where.startswith("gs://"):
        return LocalStore(where)
    if prefer in ("auto", "client"):
        try:
            return ClientStore(where)
        except ImportError:
            if prefer == "client":
                raise
    if shutil.which("gcloud") is None:
        raise SystemExit("train.py: to use a gs:// checkpoint directory, install google-cloud-storage or gcloud")
    return GcloudStore(where)


# --------------------------------------------------------------- training


def initial_state() -> dict:
    return {"step": 0, "w": 0.0, "b": 0.0, "loss": None}


def train_step(state: dict, lr: float = 0.05) -> dict:
    """One step of gradient descent on y = 3x + 1 (a stand-in for the real thing)."""
    xs = [i / 10 for i in range(10)]
    w, b = state["w"], state["b"]
    errors = [(w * x + b) - (3 * x + 1) for x in xs]
    loss = sum(e * e for e in errors) / len(xs)
    gw = sum(2 * e * x for e, x in zip(errors, xs)) / len(xs)
    gb = sum(2 * e for e in errors) / len(xs)
    return {"step": state["step"] + 1, "w": w - lr * gw, "b": b - lr * gb, "loss": loss}


def load_checkpoint(store) -> dict | None:
    data = store.read(CHECKPOINT_NAME)
    return json.loads(data) if data else None


def save_checkpoint(store, state: dict, writer: bool) -> None:
    if writer:
        store.write(CHECKPOINT_NAME, json.dumps(state).encode())
        print(f"checkpoint saved at step {state['step']}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=int(env("TRAIN_STEPS", "100")), help="steps in all (TRAIN_STEPS)")
    p.add_argument("--step-seconds", type=float, default=float(env("TRAIN_STEP_SECONDS", "0.5")),
                   help="how long a step takes (TRAIN_STEP_SECONDS)")
    p.add_argument("--checkpoint-every", type=int, default=int(env("TRAIN_CHECKPOINT_EVERY", "10")),
                   help="save every N steps (TRAIN_CHECKPOINT_EVERY)")
    p.add_argument("--checkpoint-dir", default=env("CHECKPOINT_GCS_DIR") or "checkpoints",
                   help="gs://... or a directory (default: $CHECKPOINT_GCS_DIR, set by tpuq)")
    p.add_argument("--storage", choices=("auto", "client", "gcloud"), default=env("TRAIN_STORAGE", "auto"),
                   help="how to reach Cloud Storage (TRAIN_STORAGE)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the preemption notice (or a cancel): save, then stop
    worker = int(os.environ.get("TPU_WORKER_ID", "0"))
    store = open_store(args.checkpoint_dir, args.storage)
    print(f"attempt {os.environ.get('TPUQ_ATTEMPT', '1')}, preemptions so far "
          f"{os.environ.get('TPUQ_PREEMPTIONS', '0')}, worker {worker}", flush=True)

    state = load_checkpoint(store)
    if state is not None:
        if os.environ.get("TPUQ_RESUMING") == "1":
            print(f"resuming from step {state['step']}", flush=True)
        else:
            print(f"found a checkpoint at step {state['step']} from an earlier run; continuing from it", flush=True)
    else:
        state = initial_state()
        print("starting from step 0", flush=True)

    while state["step"] < args.steps:
        if stop.is_set():
            save_checkpoint(store, state, worker == 0)
            print(f"stopped by SIGTERM at step {state['step']}", flush=True)
            return EXIT_STOPPED
        stop.wait(args.step_seconds)  # the step's work; a SIGTERM ends the wait at once
        if stop.is_set():
            continue  # the interrupted step is not counted: save the last whole one
        state = train_step(state)
        print(f"step {state['step']} loss {state['loss']:.6f}", flush=True)
        if state["step"] % args.checkpoint_every == 0:
            try:
                save_checkpoint(store, state, worker == 0)
            except Exception:
                if not stop.is_set():
                    raise
                # The notice came during this save, and a VM's shutdown signals every process: the copy died
                # with it. The stop above saves again, in a copy started after the signal.
                print(f"the save at step {state['step']} was stopped by SIGTERM; saving again", flush=True)
    save_checkpoint(store, state, worker == 0)
    print(f"done at step {state['step']}: w={state['w']:.3f} b={state['b']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
