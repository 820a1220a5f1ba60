"""The claimer's handlers on the in-memory store, with the fake Cloud TPU API and its call log as the witness."""

from __future__ import annotations

import pytest

from tpuq.operations.fleetreport import fleet_report, fleet_view
from tpuq.runtime.service import utcnow
from tpuq_dev.devstack.stack import wait_for
from tpuq.contracts.messages import CapacityAction, CapacityRequest, FailureClass, FleetEventKind, Tick

from .conftest import fleet_data, scenario_data

ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]


def request(rid="job-1", types=("v4-32",), count=1, **kw) -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="race", types=list(types), count=count, **kw)


def test_race_one_per_zone_backoff_for_stockout_first_active_announced(claimer):
    h = claimer(scenario_data(ZONES, stocked_out=[ZONES[0]], provisioning=60))
    h.fleet(fleet_data(ZONES))
    h.push("/push/capacity", request())
    assert [len(h.creates(z)) for z in ZONES] == [1, 1, 1]
    # The stocked-out zone fails with "no more capacity": deleted and backed off, never retried quickly.
    failed = h.wait_event(lambda e: e.kind is FleetEventKind.failed, "capacity failure event")
    assert failed.zone == ZONES[0] and failed.failure_class is FailureClass.capacity
    assert len(h.deletes(ZONES[0])) == 1
    report = fleet_report(h.clients.firestore, "race")
    assert [b["zone"] for b in report["backoffs"]] == [ZONES[0]]
    # As soon as the fake has a node READY, one watch pass announces it.
    node = f"projects/tpuq-test/locations/{ZONES[1]}/nodes/tq-job-1-{ZONES[1]}"
    wait_for(lambda: h.control.node_info(node)["node"].get("state") == "READY" if _exists(h, node) else False,
             what="node READY in the fake")
    h.push("/push/ticks", Tick(seq=1))
    active = [e for e in h.pull_events() if e.kind is FleetEventKind.active]
    assert active, "ACTIVE not announced by the first watch pass after the node was READY"
    first = active[0]
    assert first.chips == 16 and first.hosts == 4 and len(first.endpoints) == 4
    assert all(ep.port for ep in first.endpoints) and first.request_id == "job-1"
    # More ticks: no second create in the backed-off zone, no duplicate ACTIVE.
    h.push("/push/ticks", Tick(seq=2))
    h.push("/push/ticks", Tick(seq=3))
    assert len(h.creates(ZONES[0])) == 1
    announced = [(e.queued_resource, e.kind) for e in h.pull_events()]
    assert len(announced) == len(set(announced))


def _exists(h, node) -> bool:
    try:
        h.control.node_info(node)
        return True
    except Exception:  # noqa: BLE001 - not created yet
        return False


def test_redelivered_messages_create_nothing_more(claimer):
    h = claimer(scenario_data(ZONES, stocked_out=[ZONES[0]]))
    h.fleet(fleet_data(ZONES))
    message_id = h.push("/push/capacity", request())
    h.push("/push/capacity", request(), message_id=message_id)
    h.push("/push/capacity", request(), message_id=message_id)
    tick_id = h.push("/push/ticks", Tick(seq=1))
    h.push("/push/ticks", Tick(seq=1), message_id=tick_id)
    h.push("/push/ticks", Tick(seq=1), message_id=tick_id)
    assert [len(h.creates(z)) for z in ZONES] == [1, 1, 1]
    assert sorted(d["zone"] for d in h.qr_docs()) == ZONES
    failures = [e for e in h.pull_events() if e.kind is FleetEventKind.failed]
    assert len(failures) == 1


def test_billing_disabled_stops_every_create_and_is_reported(claimer):
    # The Billing API cannot be read here (so the pre-check lets the first create go): the TPU API's refusal blocks.
    h = claimer(scenario_data(ZONES, billing={"disabled": True, "permission_denied": True}))
    h.fleet(fleet_data(ZONES))
    h.push("/push/capacity", request())
    assert len(h.creates()) == 1
    h.push("/push/capacity", request("job-2"))
    h.push("/push/ticks", Tick(seq=1))
    h.push("/push/ticks", Tick(seq=2))
    assert len(h.creates()) == 1
    report = fleet_report(h.clients.firestore, "race")
    assert report["blocked"].startswith("billing is disabled on project tpuq-test")
    # ... and `tpuq fleet` shows it to people.
    shown = h.tpuq("fleet", "--name", "race")
    assert shown.exit_code == 0, shown.output
    assert "blocked: billing is disabled on project tpuq-test" in shown.stdout
    # Once a person has fixed billing, `tpuq fleet unblock` lets the claimer create again.
    h.control.set_billing(True)
    unblocked = h.tpuq("fleet", "unblock", "--name", "race")
    assert unblocked.exit_code == 0 and "unblocked" in unblocked.stdout, unblocked.output
    h.push("/push/capacity", request("job-3"))
    assert len(h.creates()) > 1


def test_quota_limit_zero_drops_that_zone_after_one_failure(claimer):
    scenario = scenario_data(ZONES, provisioning=1e6)
    scenario["zones"][ZONES[2]]["quota"] = {}
    h = claimer(scenario)
    h.fleet(fleet_data(ZONES))
    h.push("/push/capacity", request())
    wait_for(lambda: any(e.failure_class is FailureClass.zone_quota for e in h.pull_events()), what="quota failure")
    for seq in range(3):
        h.push("/push/ticks", Tick(seq=seq))
    assert [len(h.creates(z)) for z in ZONES] == [1, 1, 1]
    report = fleet_report(h.clients.firestore, "race")
    assert [d["zone"] for d in report["dropped"]] == [ZONES[2]]
    assert report["dropped"][0]["reason"].startswith(f"no spot quota for v4-32 in {ZONES[2]}: raise it")
    assert "Limit: 0" in report["dropped"][0]["detail"]  # the API's own text: --verbose, --json
    states = {q["zone"]: q["state"] for q in report["queued_resources"]}
    assert states[ZONES[0]] != "GONE" and states[ZONES[1]] != "GONE"


def _target_doc(h, zone: str, tpu_type: str = "v4-32") -> dict:
    snaps = [s.to_dict() for s in h.clients.firestore.collection("zones").stream()]
    return next((d for d in snaps if d.get("zone") == zone and d.get("type") == tpu_type), {})


def _stopped(h, zone: str, hours: float = 0.5) -> bool:
    from datetime import timedelta

    until = _target_doc(h, zone).get("backoff_until")
    return until is not None and until > utcnow() + timedelta(hours=hours)


def _tick_until(h, predicate, what: str, timeout: float = 30.0):
    seq = iter(range(10_000, 1_000_000))

    def step():
        h.push("/push/ticks", Tick(seq=next(seq)))
        return predicate()

    return wait_for(step, timeout=timeout, interval=0.2, what=what)


@pytest.mark.parametrize("failing", ["unknown", "external_ips"])
def test_unknown_or_external_ip_zone_is_retried_once_after_a_backoff_then_stopped(claimer, failing):
    """The call log shows exactly two creates in the zone: the first, and one retry after the back-off; then the
    zone and type stay stopped (the long back-off) however many ticks come."""
    zone = ZONES[0]
    scenario = scenario_data([zone], provisioning=1e6)
    if failing == "unknown":  # every request there fails with the API's internal error
        scenario["zones"][zone]["failures"] = [{"error": "unknown"}]
    else:  # the region's external IP quota holds fewer addresses than a v4-32 has hosts (4)
        scenario["network"] = {"external_ip_quota": {"us-central2": 2}}
    h = claimer(scenario)
    fleet = fleet_data([zone])
    fleet["claim"].update(capacity_backoff_base_seconds=1, capacity_backoff_max_seconds=1)
    h.fleet(fleet)
    h.push("/push/capacity", request())
    assert len(h.creates(zone)) == 1
    _tick_until(h, lambda: len(h.creates(zone)) == 2, "the one retry after the back-off")
    _tick_until(h, lambda: _stopped(h, zone), "the zone stopped after its retry failed")
    for seq in range(5):
        h.push("/push/ticks", Tick(seq=100 + seq))
    assert len(h.creates(zone)) == 2
    report = fleet_report(h.clients.firestore, "race")
    assert report["dropped"] == []  # stopped for a while, not dropped until the fleet file changes
    [backoff] = [b for b in report["backoffs"] if b["zone"] == zone]
    failures = [e for e in h.pull_events() if e.kind is FleetEventKind.failed]
    assert [e.failure_class.value for e in failures] == [
        "unknown" if failing == "unknown" else "external_ip_quota"] * 2
    # `tpuq fleet` shows the raw error on the stopped zone.
    [note] = [z["note"] for z in fleet_view(h.clients.firestore, "race", utcnow())["zones"] if z["key"].startswith(zone)]
    assert note.startswith("stopped until ") and "after 2 failure(s): " in note and backoff["reason"] in note
    if failing == "unknown":
        assert "An internal error has occurred" in backoff["reason"] and "[code 13]" in backoff["reason"]
    else:
        assert "IN_USE_ADDRESSES" in backoff["reason"] and "worker_external_ips: false" in backoff["reason"]
        assert "IN_USE_ADDRESSES" in failures[-1].failure_message  # what the waiting job shows


def test_a_second_region_without_the_fleets_subnet_is_dropped_with_the_command_to_create_it(claimer):
    """A custom-mode network with the fleet's subnet in us-central1 only: the create in europe-west4 is refused by the
    fake's TPU API, and the claimer drops europe-west4 with a reason naming the region and the owner's command, shown
    by `tpuq fleet` and a waiting job; no tick creates there again, and us-central1 races on. Before, the refusal read
    as unknown: one blind retry, then an hour's stop with the API's bare text."""
    from datetime import timezone

    from tpuq.operations.fleetreport import waiting_reason
    from tpuq.capacity.subnets import example_subnet_range

    zones = ["us-central1-a", "europe-west4-b"]
    scenario = scenario_data(zones, families=("v5litepod",), provisioning=1e6)
    scenario["network"] = {"subnetworks": [{"name": "tpu-subnet", "region": "us-central1", "network": "tpu-net",
                                            "ipCidrRange": "10.20.0.0/20"}]}
    h = claimer(scenario)
    fleet = fleet_data(zones, types=("v5litepod-8",), network="tpu-net", subnetwork="tpu-subnet")
    fleet["claim"].update(capacity_backoff_base_seconds=1, capacity_backoff_max_seconds=1)
    h.fleet(fleet)
    h.push("/push/capacity", request(types=("v5litepod-8",)))
    assert [len(h.creates(z)) for z in zones] == [1, 1]
    failed = h.wait_event(lambda e: e.kind is FleetEventKind.failed, "the refusal in europe-west4")
    assert failed.zone == zones[1] and failed.failure_class is FailureClass.network
    for seq in range(3):
        h.push("/push/ticks", Tick(seq=300 + seq))
    assert len(h.creates(zones[1])) == 1 and len(h.creates(zones[0])) == 1
    command = (f"gcloud compute networks subnets create tpu-subnet --network=tpu-net --region=europe-west4 "
               f"--range={example_subnet_range('europe-west4')} --project=tpuq-test")
    [dropped] = fleet_report(h.clients.firestore, "race")["dropped"]
    assert dropped["zone"] == zones[1] and command in dropped["reason"]
    assert "subnetwork resource cannot be found" in dropped["detail"]  # the API's own text, for --verbose
    view = fleet_view(h.clients.firestore, "race", utcnow())
    [note] = [z["note"] for z in view["zones"] if z["key"].startswith(zones[1])]
    assert note.startswith("dropped: no subnet tpu-subnet of network tpu-net in region europe-west4") and command in note
    held = waiting_reason({"state": "pending", "spec": {"tpu": ["v5litepod-8"]}}, [view], utcnow(), timezone.utc)
    assert held.startswith("racing v5litepod-8 in us-central1-a; ")
    assert f"europe-west4-b dropped: no subnet tpu-subnet of network tpu-net in region europe-west4" in held


def test_expired_request_is_requested_again_in_the_same_zone_without_penalty(claimer):
    zone = ZONES[0]
    scenario = scenario_data([zone], provisioning=1e6)
    scenario["zones"][zone]["stockouts"] = [{"effect": "wait"}]  # waits until validUntil passes
    h = claimer(scenario)
    fleet = fleet_data([zone])
    fleet["claim"]["valid_until_seconds"] = 60  # 60 scenario seconds: 0.1 s at the fake's time scale
    h.fleet(fleet)
    h.push("/push/capacity", request())
    expired = h.wait_event(lambda e: e.kind is FleetEventKind.failed, "the request's expiry")
    assert expired.failure_class is FailureClass.expired and expired.zone == zone
    _tick_until(h, lambda: len(h.creates(zone)) >= 2, "the request made again in the same zone")
    again = h.creates(zone)[1]
    assert again["args"]["queuedResourceId"] == f"tq-job-1-{zone}-1"
    target = _target_doc(h, zone)
    assert not target.get("capacity_failures") and not target.get("unknown_failures")
    assert target.get("dropped_version") is None


def test_error_info_decides_a_synchronous_refusal_whatever_its_words(claimer):
    """The fake answers the create with the real billing refusal's ErrorInfo (BILLING_DISABLED) under a message
    that names nothing: the claimer blocks the project from the structure alone."""
    h = claimer(scenario_data(ZONES, provisioning=1e6))
    h.fleet(fleet_data(ZONES))
    h.control.inject_fault(error_class="billing", message="Request refused.", method="POST", count=1)
    h.push("/push/capacity", request())
    assert len(h.creates()) == 1  # the first refusal stops the rest of the fan-out
    report = fleet_report(h.clients.firestore, "race")
    assert report["blocked"].startswith("billing is disabled on project")  # the short reason, what to run
    assert "reason BILLING_DISABLED (googleapis.com)" in report["blocked_detail"]  # the API's own error behind it


def test_a_synchronous_quota_429_drops_the_zone_from_its_quota_failure(claimer):
    a, b = ZONES[:2]
    h = claimer(scenario_data([a, b], provisioning=1e6))
    h.fleet(fleet_data([a, b]))
    h.control.inject_fault(error_class="quota", message="Request refused.", method="POST",
                           path_contains=f"/locations/{a}/", count=1)
    h.push("/push/capacity", request())
    assert [c["status"] for c in h.creates(a)] == [429] and [c["status"] for c in h.creates(b)] == [200]
    report = fleet_report(h.clients.firestore, "race")
    assert [d["zone"] for d in report["dropped"]] == [a]


def test_provisioning_is_never_sent_a_delete(claimer):
    h = claimer(scenario_data(ZONES[:2], provisioning=1e6))
    h.fleet(fleet_data(ZONES[:2]))
    h.push("/push/capacity", request())

    def both_provisioning() -> bool:
        h.push("/push/ticks", Tick())  # each poll is one watch pass
        return len([e for e in h.pull_events() if e.kind is FleetEventKind.provisioning]) == 2

    wait_for(both_provisioning, what="both PROVISIONING")
    h.push("/push/capacity", request(action=CapacityAction.withdraw))
    h.push("/push/ticks", Tick(seq=1))
    assert h.deletes() == []
    docs = {d["zone"]: d for d in h.qr_docs()}
    assert {d["state"] for d in docs.values()} == {"PROVISIONING"}


def test_watch_pass_makes_one_exact_get_per_owned_resource(claimer):
    zones = [f"us-test{n}-a" for n in range(1, 21)]
    types = ("v4-32", "v5litepod-8", "v6e-8")
    h = claimer(scenario_data(zones, families=("v4", "v5litepod", "v6e"), provisioning=1e6, waiting=1e6))
    data = fleet_data(zones, types=types, count=20)
    for entry in data["tpus"]:
        entry["single_slot"] = False  # fan every type out, v6e too: 60 racers to watch
    h.fleet(data)
    for t in types:
        h.push("/push/capacity", request(f"job-{t.replace('-', '')}", types=(t,)))
    assert len(h.creates()) == 60
    h.control.clear_calls()
    h.push("/push/ticks", Tick(seq=1))
    calls = h.control.calls()
    gets = [c for c in calls if c["method"] == "GET"]
    lists = [c for c in gets if c["path"].endswith("/queuedResources") or c["path"].endswith("/nodes")]
    assert lists == []
    assert sorted(c["path"].rsplit("/", 1)[-1] for c in gets) == sorted(d["qr_id"] for d in h.qr_docs())
    assert len(gets) == 60 and len(calls) == 60


def test_transient_api_errors_are_retried_and_the_request_is_never_lost(claimer):
    a, b = ZONES[:2]
    h = claimer(scenario_data([a, b], provisioning=1e6))
    h.fleet(fleet_data([a, b]))
    h.control.inject_fault("UNAVAILABLE", method="POST", count=2)
    h.push("/push/capacity", request(zones=[a]))
    assert [c["status"] for c in h.creates(a)] == [503, 503, 200]
    # Still failing after the retries: the handler asks Pub/Sub to redeliver; the create stays recorded.
    h.control.inject_fault("UNAVAILABLE", method="POST", count=4)
    assert h.push("/push/capacity", request("job-2", zones=[b]), expect=(503,))
    # The next pass (here a tick; a redelivery would do the same) finishes it under the same name.
    h.push("/push/ticks", Tick(seq=1))
    assert [c["status"] for c in h.creates(b)] == [503] * 4 + [200]
    assert len({c["path"] + c["args"]["queuedResourceId"] for c in h.creates(b)}) == 1


def test_the_created_nodes_run_as_the_settings_worker_account(claimer):
    """The account comes from the Settings the service was built with (read once from $TPUQ_WORKER_SERVICE_ACCOUNT
    at start), not from the process environment at each create."""
    account = "tpuq-worker@tpuq-test.iam.gserviceaccount.com"
    h = claimer(scenario_data(ZONES[:1], provisioning=1e6), worker_service_account=account)
    h.fleet(fleet_data(ZONES[:1]))
    h.push("/push/capacity", request())
    [create] = h.creates()
    node = create["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["serviceAccount"]["email"] == account


def test_each_service_instance_keeps_its_own_node_reader_and_pre_check_cache():
    """Per-instance state lives in the service (ctx.state), not in a module registry keyed by the clients: two
    claimers on the same clients share neither their HTTP session for nodes nor their quota and billing cache."""
    from tpuq.claimer.handlers import build_service
    from tpuq.runtime.clients import Clients
    from tpuq.runtime.settings import Settings

    settings = Settings(project="p", tpu_endpoint="http://127.0.0.1:9", quotas_endpoint="http://127.0.0.1:9",
                        billing_endpoint="http://127.0.0.1:9", env={"TPUQ_SSH_PUBLIC_KEY": "ssh-ed25519 AAAA"})
    clients = Clients(settings)
    first, second = build_service(settings, clients), build_service(settings, clients)
    ctx = type("Ctx", (), {"settings": settings, "clients": clients})
    assert first.state.node_reader is not second.state.node_reader
    assert first.state.prechecks(ctx) is first.state.prechecks(ctx) is not None
    assert first.state.prechecks(ctx) is not second.state.prechecks(ctx)
    assert first.state.public_key(None) == "ssh-ed25519 AAAA"  # from the settings' environment, not os.environ




def test_a_create_whose_zone_slot_another_handler_took_is_planned_again_at_once(claimer):
    """N jobs submitted together are N capacity requests handled at once; each create is conditioned on the zone's
    version its handler read (`claim_and_record`), and a zone races one request of a type at a time. Staged here:
    job-9's request is handled while job-2's handler is loading (it has read the zones, not yet its request), so
    neither sees the other's request, and job-9 claims the first zone. job-2's create there loses its claim; it
    plans again at once on a fresh read (`CLAIM_RETRIES`) and races in the second zone, rather than having no racer
    until the next tick (a minute in production)."""
    h = claimer(scenario_data(ZONES[:2], provisioning=600))
    h.fleet(fleet_data(ZONES[:2], count=3, claim={"watch_interval_seconds": 0.3, "hedge_seconds": 300}))
    db = h.clients.firestore

    class AnotherHandlerFirst:
        """When job-2's handler reads its request (after the zones and queued resources): job-9's capacity request
        is handled to the end, as a handler running at the same time could."""

        staged = False

        def read_document(self, path):
            if not self.staged and path == "requests/job-2":
                self.staged = True
                db.observer = None
                h.push("/push/capacity", request("job-9"))

        def read_query(self, collection, filters):
            pass

        def changed(self, path, before, after):
            pass

    db.observer = raced = AnotherHandlerFirst()
    h.push("/push/capacity", request("job-2"))
    db.observer = None
    assert raced.staged, "the race was not staged"
    zones_of = {rid: [d["zone"] for d in h.qr_docs() if d["request_id"] == rid] for rid in ("job-9", "job-2")}
    assert zones_of == {"job-9": [ZONES[0]], "job-2": [ZONES[1]]}, zones_of  # job-2: none until a tick, before
    assert len(h.creates(ZONES[0])) == 1 and len(h.creates(ZONES[1])) == 1
