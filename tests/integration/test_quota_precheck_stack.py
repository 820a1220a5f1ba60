"""Quota and billing before queueing, on a whole stack: the claimer as a process behind Pub/Sub push, the fake TPU
and its Cloud Quotas and Cloud Billing stand-ins (their own URL, published by the stack), and `tpuq fleet`.

The fake TPU's call log is the witness of where the claimer created; the Google APIs' log of what it read.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import DevStack
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq.contracts.messages import CapacityRequest, Tick
from tpuq.runtime.service import utcnow

ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]
NO_QUOTA = ZONES[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("quota-stack"))
    scenario = root / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({
        "zones": {z: {"quota": {"v4": {"spot": 0 if z == NO_QUOTA else 64}}} for z in ZONES},
        "delays": {"accepted": 1, "waiting": 5, "provisioning": 1e6},
        "billing": {"disabled": True},
    }))
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({  # no quota block: every number comes from the Cloud Quotas API
        "name": "qs", "project": "tpuq-local", "owner_prefix": "tq",
        "claim": {"watch_interval_seconds": 0.3},
        "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 3}],
    }))
    s = DevStack(state_dir=root / "dev", services=("claimer",), scenario=scenario, fleet_file=fleet,
                 time_scale=60.0, tick_period=1.0)
    with s.running():
        yield s


def creates(control: FakeTpuControl, zone: str | None = None) -> list[dict]:
    return [c for c in control.calls(method="POST", path_contains="/queuedResources")
            if zone is None or f"/locations/{zone}/" in c["path"]]


def tpuq_fleet(stack) -> str:
    env = {**os.environ, **stack.env, "TPUQ_DEV_DIR": str(stack.state_dir), "COLUMNS": "200"}
    done = subprocess.run(["tpuq", "fleet", "--name", "qs"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_billing_off_creates_nothing_then_quota_0_zone_is_skipped(stack):
    clients = Clients(Settings.from_env(stack.env))
    control = FakeTpuControl(stack.env["TPUQ_TPU_API_ENDPOINT"])
    google = FakeTpuControl(stack.env["TPUQ_CLOUDQUOTAS_API_ENDPOINT"])
    assert stack.env["TPUQ_CLOUDQUOTAS_API_ENDPOINT"] != stack.env["TPUQ_TPU_API_ENDPOINT"]  # its own server

    # Billing off: the claimer blocks the project before its first create.
    clients.publish("capacity", CapacityRequest(request_id="r1", fleet="qs", types=["v4-32"], count=1, at=utcnow()))
    status = clients.firestore.collection(store.FLEET_STATUS).document("qs")
    wait_until(lambda: (status.get().to_dict() or {}).get("blocked"), timeout=60, what="the billing block")
    wait_until(lambda: len([c for c in google.calls() if c["path"].endswith("/billingInfo")]) >= 2, timeout=30,
               what="a tick's billing read")
    assert creates(control) == []
    shown = tpuq_fleet(stack)
    assert "blocked: billing is disabled on project tpuq-local" in shown
    assert "billing: disabled" in shown

    # A person enables billing and unblocks: the claimer races every zone with quota, and never the one without.
    control.set_billing(True)
    env = {**os.environ, **stack.env, "TPUQ_DEV_DIR": str(stack.state_dir)}
    unblock = subprocess.run(["tpuq", "fleet", "unblock", "--name", "qs"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert unblock.returncode == 0, unblock.stderr
    clients.publish("ticks", Tick(seq=1))
    wait_until(lambda: len(creates(control, ZONES[0])) and len(creates(control, ZONES[2])), timeout=60,
               what="creates in the zones with quota")
    assert creates(control, NO_QUOTA) == []  # decided in the same pass as the other two
    shown = tpuq_fleet(stack)
    print(shown)  # the view as a person sees it (pytest -s)
    assert "billing: enabled" in shown
    assert (f"zone {NO_QUOTA} v4-32: skipped: no quota: 0 chips < 16 for one v4-32 (Cloud Quotas "
            f"TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI: 0 TensorCores in {NO_QUOTA})") in shown
    assert (f"quota {ZONES[0]} v4-32: 64 chips (Cloud Quotas TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI: "
            f"128 TensorCores in {ZONES[0]})") in shown
