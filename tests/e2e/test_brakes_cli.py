"""The brakes, driven as a user does: `tpuq fleet pause / resume / drain --now`, a fleet file with `budget` and
`grant_expires`, and what `tpuq fleet`, `tpuq status` and `tpuq list` show, on a whole local stack of its own.

Witnesses: the fake TPU's call log (creates, deletes), the fake's own lists (what is left), Firestore (jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import DevStack
from tpuq_dev.faketpu.control import FakeTpuControl
from tests.helpers import wait_until

PROJECT = "tpuq-local"
OPEN_A, STOCKED_OUT, OPEN_C = "us-central2-a", "us-central2-b", "us-central2-c"
ZONES = (OPEN_A, STOCKED_OUT, OPEN_C)
SCENARIO = {
    "seed": 3,
    "zones": {OPEN_A: {"quota": {"v4": {"spot": 64}}},
              STOCKED_OUT: {"quota": {"v4": {"spot": 64}}, "stockouts": [{"family": "v4", "start": 0, "effect": "fail"}]},
              OPEN_C: {"quota": {"v4": {"spot": 64}}}},
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 60, "suspending": 10, "deleting": 5, "host_keys": 30},
}
FLEET = {
    "name": "brakes", "project": PROJECT, "owner_prefix": "tpuq",
    "idle_timeout_seconds": 3600,  # an idle TPU that goes within the test went because of the pause
    "retry": {"preemptions": 3, "infra_failures": 1, "backoff_base_seconds": 0.5, "backoff_max_seconds": 2},
    # A stocked-out zone stays backed off for the whole test: its local time is shown.
    "claim": {"valid_until_seconds": 3600, "watch_interval_seconds": 1, "capacity_backoff_base_seconds": 7200},
    "quota": {z: {"v4": {"spot": 64}} for z in ZONES},
    "tpus": [{"id": "v4-single", "type": "v4-8", "zones": list(ZONES), "count": 2}],
}
DEADLINE = 300
TZ = "Europe/Paris"  # the machine's local zone for the CLI: times read "14:03 CET"


@pytest.fixture(scope="module")
def brakes(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("tpuq-brakes"))
    (root / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
    (root / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    s = DevStack(state_dir=root / "stack", services=("scheduler", "claimer", "executor", "janitor"),
                 scenario=root / "scenario.yaml", fleet_file=root / "fleet.yaml", time_scale=60.0, tick_period=1.0,
                 extra_buckets=("tpuq-demo-us-central2",))
    with s.running():
        yield s


@pytest.fixture
def world(brakes, tmp_path):
    w = World(brakes, Clients(Settings.from_env(brakes.env)), FakeTpuControl(brakes.env["TPUQ_TPU_API_ENDPOINT"]),
              tmp_path)
    yield w
    w.tpuq("fleet", "resume")
    w.apply(FLEET)


class World:
    def __init__(self, stack, clients, control, tmp):
        self.stack, self.clients, self.control, self.tmp = stack, clients, control, tmp
        self.tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                                    client_options=ClientOptions(api_endpoint=stack.env["TPUQ_TPU_API_ENDPOINT"]))

    def tpuq(self, *args, ok: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["tpuq", *args], env={**os.environ, **self.stack.env, "TZ": TZ}, capture_output=True,
                              text=True, timeout=DEADLINE + 60)
        if ok:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def apply(self, fleet: dict) -> None:
        path = self.tmp / f"fleet-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(fleet))
        self.tpuq("fleet", "apply", str(path))

    def fleet_json(self) -> dict:
        return json.loads(self.tpuq("fleet", "--json").stdout)

    def submit(self, command: str, tpu: str = "v4-8") -> str:
        job_id = f"b-{uuid.uuid4().hex[:8]}"
        self.clients.publish("jobs", {"id": job_id, "tpu": tpu, "command": command})
        return job_id

    def job(self, job_id: str) -> dict:
        snap = self.clients.firestore.collection(store.JOBS).document(job_id).get()
        return (snap.to_dict() or {}) if snap.exists else {}

    def wait_state(self, job_id: str, *states: str) -> dict:
        return wait_until(lambda: (j := self.job(job_id)).get("state") in states and j, timeout=DEADLINE,
                          what=f"job {job_id} in {states}")

    def creates(self) -> list[dict]:
        return [c for c in self.control.calls(method="POST") if c["path"].endswith("/queuedResources")]

    def deleted_ids(self) -> set[str]:
        return {c["path"].split("?")[0].rsplit("/", 1)[-1] for c in self.control.calls(method="DELETE")}

    def request_recorded(self, job_id: str) -> bool:
        return any(d.to_dict().get("job_ids", []) == [job_id] for d in
                   self.clients.firestore.collection(store.REQUESTS).stream())

    def listed(self) -> dict[str, str]:
        """name -> state of every queued resource and node in the fleet's zones, as the API lists them."""
        out = {}
        for zone in ZONES:
            parent = f"projects/{PROJECT}/locations/{zone}"
            out |= {q.name: q.state.state.name for q in self.tpu.list_queued_resources(parent=parent)}
            out |= {n.name: n.state.name for n in self.tpu.list_nodes(parent=parent)}
        return out

    def create_foreign(self, qr_id: str, zone: str = OPEN_A, labels: dict | None = None) -> str:
        """A queued resource someone made by hand, without tpuq's labels."""
        parent = f"projects/{PROJECT}/locations/{zone}"
        node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels=labels or {},
                           scheduling_config=tpu_v2.SchedulingConfig(spot=True))
        self.tpu.create_queued_resource(request=tpu_v2.CreateQueuedResourceRequest(
            parent=parent, queued_resource_id=qr_id, queued_resource=tpu_v2.QueuedResource(
                tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                    parent=parent, node_id=qr_id, node=node)]), spot=tpu_v2.QueuedResource.Spot())))
        return f"{parent}/queuedResources/{qr_id}"


def test_pause_deletes_idle_tpus_creates_nothing_and_resume_claims_again(world):
    first = world.submit("echo one")
    done = world.wait_state(first, "succeeded")
    tpu_id = done["tpu"].rsplit("/", 1)[-1]
    # The job's end and the slice's release are two events: wait for the release, do not read the moment between.
    wait_until(lambda: world.clients.firestore.collection(store.TPUS).document(tpu_id).get().to_dict()["state"]
               == "idle", timeout=DEADLINE, what="the TPU released as idle after its job succeeded")

    # §6: per zone and type, the stocked-out zone's back-off in local time, racing and quota with its source.
    # The back-off is the claimer's record of that zone's failed racer, not a step of the job: wait for it.
    view = wait_until(lambda: (v := world.fleet_json()) and any(
        r["zone"] == STOCKED_OUT and r["type"] == "v4-8" and r["backoff_until_local"] for r in v["targets"]) and v,
        timeout=DEADLINE, what="tpuq fleet to show the stocked-out zone backed off")
    rows = {(r["zone"], r["type"]): r for r in view["targets"]}
    assert rows[(STOCKED_OUT, "v4-8")]["backoff_until_local"].endswith(("CET", "CEST"))
    assert rows[(OPEN_A, "v4-8")]["quota_chips"] == 64 and rows[(OPEN_A, "v4-8")]["quota_source"] == "fleet file"
    human = world.tpuq("fleet").stdout
    assert f"backed off until {rows[(STOCKED_OUT, 'v4-8')]['backoff_until_local']}" in human

    started = time.monotonic()
    paused = world.tpuq("fleet", "pause")
    assert "paused" in paused.stdout
    mark = len(world.control.calls())
    # Idle TPUs go at once (its idle timeout is an hour).
    wait_until(lambda: world.clients.firestore.collection(store.TPUS).document(tpu_id).get().to_dict()["state"]
               == "gone", timeout=DEADLINE, what="the idle TPU deleted on pause")
    print(f"tpuq fleet pause -> idle TPU recorded gone: {time.monotonic() - started:.1f} s (idle timeout 3600 s)")
    assert tpu_id in world.deleted_ids()

    second = world.submit("echo two")
    wait_until(lambda: world.request_recorded(second), timeout=DEADLINE, what="the claimer to record the request")
    status = wait_until(lambda: "paused" in (out := world.tpuq("status", second).stdout) and out, timeout=DEADLINE,
                        what="the waiting job to say the pause holds it")
    assert "waiting: claiming stopped: fleet brakes is paused" in status
    assert "paused" in world.tpuq("list").stdout
    assert world.fleet_json()["brakes"]["paused"] is True
    after_pause = world.control.calls()[mark:]
    assert not [c for c in after_pause if c["method"] == "POST" and c["path"].endswith("/queuedResources")]

    paused_creates = len(world.creates())
    world.tpuq("fleet", "resume")
    world.wait_state(second, "succeeded")
    assert len(world.creates()) > paused_creates, "resumed: the claimer creates again"
    print(f"while paused: {len(after_pause)} API calls, 0 creates; after resume: "
          f"{len(world.creates()) - paused_creates} create(s)")


def test_drain_now_cancels_running_jobs_and_deletes_only_what_tpuq_owns(world):
    running = world.submit("sleep 600")
    world.wait_state(running, "running")
    foreign = [world.create_foreign("user-qr"), world.create_foreign("tpuq-by-hand", OPEN_C, {"team": "ml"})]
    wait_until(lambda: all(world.listed().get(n) == "ACTIVE" for n in foreign), timeout=DEADLINE,
               what="the foreign queued resources ACTIVE")
    owned_before = {n for n in world.listed() if n.rsplit("/", 1)[-1].startswith("tpuq-") and "tpuq-by-hand" not in n}
    assert owned_before  # the running job's queued resource and node

    started = time.monotonic()
    drained = world.tpuq("fleet", "drain", "--now")
    print(f"tpuq fleet drain --now: {time.monotonic() - started:.1f} s, {drained.stdout.count('deleted ')} deleted")
    assert f"cancelled job {running}" in drained.stdout and "drained and paused" in drained.stdout
    printed = {line.split(" ", 1)[1] for line in drained.stdout.splitlines() if line.startswith("deleted ")}
    # What the drain's own pass deleted is printed, and is tpuq's. On a loaded machine the cancelled job's TPU may
    # already have gone as an idle TPU of the paused fleet before that pass ran: the outcome is checked below.
    assert all("/queuedResources/tpuq-" in n or "/nodes/tpuq-" in n for n in printed), printed

    assert world.wait_state(running, "cancelled")["state"] == "cancelled"
    left = world.listed()
    assert not {n for n in owned_before if left.get(n) not in (None, "DELETING")}, left
    for name in foreign:  # never touched: still ACTIVE, never sent a delete
        assert left[name] == "ACTIVE"
        assert name.rsplit("/", 1)[-1] not in world.deleted_ids()
    view = world.fleet_json()
    assert view["brakes"]["paused"] and view["brakes"]["drain"]["done"]

    again = world.tpuq("fleet", "drain", "--now")  # idempotent: nothing of ours is left
    assert "drained and paused" in again.stdout
    assert world.listed()[foreign[0]] == "ACTIVE"
    for name in foreign:
        world.tpu.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True))


def test_grant_expired_and_budget_spent_claim_nothing_and_tpuq_fleet_says_so(world):
    today = datetime.now(timezone.utc).date()  # the grant's days are UTC days
    yesterday = (today - timedelta(days=1)).isoformat()
    world.apply({**FLEET, "grant_expires": yesterday})
    mark = len(world.creates())
    job = world.submit("echo granted")
    wait_until(lambda: world.request_recorded(job), timeout=DEADLINE, what="the claimer to record the request")
    held = wait_until(lambda: "grant ended" in (out := world.tpuq("status", job).stdout) and out, timeout=DEADLINE,
                      what="the waiting job to say the grant ended")
    assert f"the grant ended on {yesterday}" in held
    assert world.fleet_json()["brakes"]["grant"] == {"expires": yesterday, "days_left": 0}
    assert "0 day(s) left" in world.tpuq("fleet").stdout
    assert len(world.creates()) == mark

    world.apply({**FLEET, "budget": {"vm_hours_per_day": 0.5}})  # one more v4-8 host-hour would pass it
    wait_until(lambda: "over budget" in world.tpuq("status", job).stdout, timeout=DEADLINE,
               what="the waiting job to say the budget holds it")
    budget = world.fleet_json()["brakes"]["budget"]
    assert budget["vm_hours_per_day"] == 0.5 and budget["used_today"] >= 0
    assert "VM-hours used today" in world.tpuq("fleet").stdout
    assert len(world.creates()) == mark

    world.apply({**FLEET, "budget": {"vm_hours_per_day": 1000}, "grant_expires": today.isoformat()})
    world.wait_state(job, "succeeded")
    assert len(world.creates()) > mark
    assert world.fleet_json()["brakes"]["grant"]["days_left"] == 1
