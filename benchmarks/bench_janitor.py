"""Benchmark of the janitor: a race's winner turns ACTIVE -> its losers are deleted.

`python benchmarks/bench_janitor.py [--runs 10]` starts the Firestore and Pub/Sub
emulators (tpuq_dev.devstack, no services), the fake Cloud TPU in this process
(manual clock), and the janitor's entry point through functions-framework's
test client. Each run races one request over 3 zones (winner ACTIVE, one loser
WAITING_FOR_RESOURCES, one ACCEPTED) and times the delivery of the winner's
ACTIVE fleet event until it is acknowledged; the deletes happen inside that
handling, which the fake's call log confirms for every run. Pub/Sub's own push
latency is not included.

Prints one JSON line: {"bench": "losers_deleted_after_active", "seconds": median, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test helpers build the same world the tests use

import functions_framework  # noqa: E402
from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402
from google.cloud import firestore, tpu_v2  # noqa: E402

from tests.helpers import push_envelope  # noqa: E402
from tests.janitor.conftest import (  # noqa: E402
    ACTIVE_AFTER, JANITOR, SCENARIO, THIRD_ZONE, WAIT_ZONE, WIN_ZONE, Stack, make_fleet)
from tpuq_dev.devstack.stack import DevStack  # noqa: E402
from tpuq_dev.capacitymodel.clock import ManualClock  # noqa: E402
from tpuq_dev.faketpu.control import FakeTpuControl  # noqa: E402
from tpuq_dev.faketpu.server import FakeTpuServer  # noqa: E402
from tpuq.runtime.fleetstore import save_fleet  # noqa: E402


def one_run(server: FakeTpuServer, db, app) -> float:
    fleet = make_fleet(f"p-{uuid.uuid4().hex[:10]}")
    save_fleet(db, fleet, datetime.now(timezone.utc))
    tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=server.url))
    s = Stack(fleet, db, tpu, FakeTpuControl(server.url), server.clock, app, [])
    s.record_request("r1")
    winner = s.create_owned("r1", WIN_ZONE)
    losers = [s.create_owned("r1", WAIT_ZONE)]
    s.advance(ACTIVE_AFTER + 1)
    losers.append(s.create_owned("r1", THIRD_ZONE))
    event = {"kind": "ACTIVE", "fleet": fleet.name, "queued_resource": winner, "request_id": "r1",
             "zone": WIN_ZONE, "type": "v4-8", "at": datetime.now(timezone.utc).isoformat()}
    start = time.perf_counter()
    status = app.post("/push/fleet-events", json=push_envelope(event, uuid.uuid4().hex, "janitor")).status_code
    seconds = time.perf_counter() - start
    assert status == 204, status
    deleted = sorted(s.deleted_ids())
    assert deleted == sorted(n.rsplit("/", 1)[-1] for n in losers), deleted
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = DevStack(state_dir=Path(tmp) / "stack", services=())
        env = stack.up()
        try:
            os.environ.update(env)
            with FakeTpuServer(SCENARIO, clock=ManualClock(), state_dir=Path(tmp) / "fake",
                               worker_hosts=False) as server:
                os.environ["TPUQ_TPU_API_ENDPOINT"] = server.url
                app = functions_framework.create_app("handle", JANITOR, "http").test_client()
                db = firestore.Client(project=env["GOOGLE_CLOUD_PROJECT"])
                one_run(server, db, app)  # warm-up: clients created, connections opened
                times = [one_run(server, db, app) for _ in range(args.runs)]
        finally:
            stack.down()
    print(json.dumps({"bench": "losers_deleted_after_active", "seconds": round(statistics.median(times), 4),
                      "max_seconds": round(max(times), 4), "runs": len(times), "zones": 3, "losers": 2}))


if __name__ == "__main__":
    main()
