"""`tpuq dev up`, `eval "$(tpuq dev env)"`, `tpuq dev down`: afterwards no process of the stack remains."""

from __future__ import annotations

import json
import os
import subprocess

from tpuq_dev.devstack.processes import ProcRecord, is_alive

from tests.helpers import wait_until


def tpuq(*args, env):
    return subprocess.run(["tpuq", *args], env=env, capture_output=True, text=True, timeout=180)


def test_dev_up_env_down_leaves_nothing_running(tmp_path):
    env = {**os.environ, "TPUQ_DEV_DIR": str(tmp_path / "dev")}
    up = tpuq("dev", "up", env=env)
    assert up.returncode == 0, up.stderr
    exported = None
    other = {k: v for k, v in os.environ.items() if k not in ("TPUQ_DEV_DIR", "TPUQ_DEV_STACK_DIR")}
    try:
        status = json.loads(tpuq("dev", "status", "--json", env=env).stdout)
        names = {p["name"] for p in status}
        assert {"pubsub-emulator", "firestore-emulator", "fake-gcs-server", "fake-tpu", "ticker", "scheduler",
                "claimer", "executor", "janitor"} <= names
        assert all(p["alive"] for p in status)
        # `dev up` says what it started, as the README says: every process `dev status` lists.
        [started] = [line for line in up.stdout.splitlines() if line.startswith("started ")]
        assert started.startswith(f"started {len(status)} processes: ") and all(n in started for n in names)
        state = json.loads((tmp_path / "dev" / "state.json").read_text())
        records = [ProcRecord(**p) for p in state["processes"]]

        exported = tpuq("dev", "env", env=env).stdout
        shell = subprocess.run(["bash", "-c", f'{exported}\necho "$PUBSUB_EMULATOR_HOST $FIRESTORE_EMULATOR_HOST '
                                              f'$STORAGE_EMULATOR_HOST $GOOGLE_CLOUD_PROJECT"'],
                               capture_output=True, text=True, check=True)
        pubsub, firestore, storage, project = shell.stdout.split()
        assert pubsub.startswith("127.0.0.1:") and firestore.startswith("127.0.0.1:")
        assert storage.startswith("http://127.0.0.1:") and project == "tpuq-local"
        tpu_endpoint = subprocess.run(["bash", "-c", f'{exported}\necho "$TPUQ_TPU_API_ENDPOINT"'],
                                      capture_output=True, text=True, check=True).stdout.strip()
        assert tpu_endpoint.startswith("http://127.0.0.1:")
        assert tpuq("dev", "up", env=env).returncode == 1  # one stack at a time, said clearly
        # Another terminal, which only evaluated `dev env` (no TPUQ_DEV_DIR): `dev status` and `dev down` there act
        # on this stack, as its other commands do.
        there = subprocess.run(["bash", "-c", f"{exported}\ntpuq dev status --json"], env=other, capture_output=True,
                               text=True, timeout=180)
        assert there.returncode == 0 and {p["name"] for p in json.loads(there.stdout)} == names, there.stderr
    finally:
        if exported is not None:
            down = subprocess.run(["bash", "-c", f"{exported}\ntpuq dev down"], env=other, capture_output=True,
                                  text=True, timeout=180)
        else:
            down = tpuq("dev", "down", env=env)
    assert down.returncode == 0, down.stderr
    assert f"stopped {len(records)} processes" in down.stdout
    assert not any(is_alive(r) for r in records)
    def group_gone(r: ProcRecord) -> bool:
        try:
            os.killpg(r.pgid, 0)  # a killed member stays until its new parent reaps it: slow on a loaded machine
        except ProcessLookupError:
            return True
        return False

    for r in records:  # nothing of their process groups either (the emulators' JVMs)
        wait_until(lambda: group_gone(r), timeout=15, what=f"process group of {r.name} gone")
    assert tpuq("dev", "status", env=env).returncode == 1
    assert "not running" in tpuq("dev", "env", env=env).stderr
