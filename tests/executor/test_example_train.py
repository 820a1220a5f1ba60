"""examples/train.py: checkpoints every N steps and on SIGTERM, and resumes from the saved step, against a local
directory, and against fake GCS through the Cloud Storage client and through `gcloud storage`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .conftest import wait_until

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


class Run:
    """train.py as a subprocess, its output collected line by line."""

    def __init__(self, env: dict, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(TRAIN), *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []

    def read_until(self, pattern: str, timeout: float = 30) -> re.Match:
        def seen():
            for line in self.lines:
                if m := re.search(pattern, line):
                    return m
            line = self.proc.stdout.readline()
            if line:
                self.lines.append(line.rstrip("\n"))
            elif self.proc.poll() is not None:
                raise AssertionError(f"train.py ended before {pattern!r}:\n" + "\n".join(self.lines))
            return None

        return wait_until(seen, timeout, pattern)

    def finish(self, timeout: float = 60) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return self.proc.returncode


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUQ_", "TRAIN_", "CHECKPOINT_GCS_DIR"))}
    return env | {"PYTHONUNBUFFERED": "1"} | extra


def preempt_then_resume(env: dict, read_checkpoint, storage_args=()) -> None:
    first = Run(env | {"TPUQ_ATTEMPT": "1", "TPUQ_PREEMPTIONS": "0"}, "--steps", "1000", "--step-seconds", "0.05",
                "--checkpoint-every", "5", *storage_args)
    try:
        first.read_until(r"^starting from step 0$")
        first.read_until(r"^step 7 ")
        first.proc.send_signal(signal.SIGTERM)  # the supervisor, on the preemption notice
        assert first.finish() == 128 + signal.SIGTERM
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    stopped = int(re.search(r"stopped by SIGTERM at step (\d+)", "\n".join(first.lines)).group(1))
    last_step = max(int(m.group(1)) for line in first.lines if (m := re.match(r"step (\d+) ", line)))
    assert stopped == last_step >= 7  # saved on SIGTERM, not only at the last multiple of 5
    assert read_checkpoint()["step"] == stopped

    second = Run(env | {"TPUQ_ATTEMPT": "2", "TPUQ_PREEMPTIONS": "1", "TPUQ_RESUMING": "1"}, "--steps",
                 str(stopped + 3), "--step-seconds", "0.01", "--checkpoint-every", "5", *storage_args)
    assert second.finish() == 0, second.lines
    assert f"resuming from step {stopped}" in second.lines
    steps = [int(m.group(1)) for line in second.lines if (m := re.match(r"step (\d+) ", line))]
    assert steps == [stopped + 1, stopped + 2, stopped + 3]
    assert read_checkpoint()["step"] == stopped + 3


def test_sigterm_saves_and_a_rerun_resumes_from_a_local_directory(tmp_path):
    where = tmp_path / "ckpt"
    preempt_then_resume(_env(CHECKPOINT_GCS_DIR=str(where)),
                        lambda: json.loads((where / "train-state.json").read_text()))


def _gcs_env(fake_gcs, bucket: str) -> tuple[dict, str]:
    prefix = f"tpuq/jobs/{uuid.uuid4().hex[:8]}/checkpoints"
    env = _env(CHECKPOINT_GCS_DIR=f"gs://{bucket}/{prefix}", STORAGE_EMULATOR_HOST=fake_gcs.base_url)
    return env, prefix


def test_checkpoints_reach_fake_gcs_through_the_client_library(fake_gcs, bucket):
    pytest.importorskip("google.cloud.storage")
    env, prefix = _gcs_env(fake_gcs, bucket)
    preempt_then_resume(env, lambda: fake_gcs.read_json(bucket, f"{prefix}/train-state.json"), ("--storage", "client"))


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_checkpoints_reach_fake_gcs_through_gcloud_storage(fake_gcs, bucket, tmp_path):
    """Given only STORAGE_EMULATOR_HOST, `gcloud storage` is pointed at it. Two gcloud calls (a cat that finds
    nothing, one cp): each takes seconds."""
    env, prefix = _gcs_env(fake_gcs, bucket)
    env |= {"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_PROJECT": "tpuq-local"}
    run = Run(env, "--steps", "2", "--step-seconds", "0", "--checkpoint-every", "10", "--storage", "gcloud")
    assert run.finish(timeout=120) == 0, run.lines
    assert "starting from step 0" in run.lines
    assert fake_gcs.read_json(bucket, f"{prefix}/train-state.json")["step"] == 2


def test_a_notice_that_stops_a_periodic_save_midway_saves_again(monkeypatch, capsys):
    """A preemption's SIGTERM reaches every process of the VM: a periodic save's `gcloud storage cp` under way
    dies with it (seen on the local stack: "gcloud storage cp failed (-15)"). The trainer saves again and stops."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)

    class CopyKilledBySignal:
        def __init__(self):
            self.saved: list[int] = []

        def read(self, name):
            return None

        def write(self, name, data):
            step = json.loads(data)["step"]
            if step == 5 and not self.saved:
                os.kill(os.getpid(), signal.SIGTERM)  # the notice, as the copy runs
                self.saved.append(-1)
                raise RuntimeError("gcloud storage cp failed (-15)")
            self.saved.append(step)

    store = CopyKilledBySignal()
    monkeypatch.setattr(train, "open_store", lambda where, prefer: store)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = train.main(["--steps", "100", "--step-seconds", "0", "--checkpoint-every", "5",
                           "--checkpoint-dir", "gs://b/ckpt"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = capsys.readouterr().out
    assert code == train.EXIT_STOPPED, out
    assert store.saved == [-1, 5]  # the killed copy, then the stop's own save of the same step
    assert "checkpoint saved at step 5\nstopped by SIGTERM at step 5" in out
