"""Unit tests of the pure core: decide_<event>(state, event, now, rng) -> effects."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tpuq.claimer.decide import capacity_backoff_seconds, decide_observed, decide_request_received
from tpuq.claimer.model import (
    REQUESTED,
    ClaimState,
    Effects,
    QrRecord,
    NodeInfo,
    Observation,
    Observed,
    RequestReceived,
    queued_resource_id,
)
from tpuq.contracts.fleet import FleetFile
from tpuq.capacity.subnets import example_subnet_range
from tpuq.contracts.messages import CapacityAction, CapacityRequest, FailureClass, FleetEventKind, WorkerEndpoint

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONES = ["us-central2-a", "us-central2-b", "us-central2-c"]
QUOTA_TEXT = "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone Z."
CAPACITY_TEXT = 'There is no more capacity in the zone "Z"; you can try in another zone'
BILLING_TEXT = "Billing account for project 'p' is not found. Billing must be enabled."


def make_fleet(**over) -> FleetFile:
    data = {
        "name": "f1",
        "project": "p",
        "owner_prefix": "tq",
        "quota": {z: {"v4": {"spot": 64}} for z in ZONES},
        "tpus": [{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 10}],
    }
    data.update(over)
    return FleetFile.model_validate(data)


def request(rid="r1", count=1, action=CapacityAction.request, **kw) -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="f1", types=["v4-32"], count=count, action=action, **kw)


def run(state: ClaimState, event, now=NOW, rng=None) -> tuple[ClaimState, Effects]:
    """The event's decide, then apply its state updates like the shell does (creates recorded as REQUESTED)."""
    decide = decide_request_received if isinstance(event, RequestReceived) else decide_observed
    effects = decide(state, event, now, rng or random.Random(1))
    new = effects.applied(state)
    new = replace(new, qrs={**new.qrs, **{c.qr.qr_id: c.qr for c in effects.creates}})
    return new, effects


def observed(state, **states_by_zone) -> Observed:
    obs = {}
    for q in state.qrs.values():
        s = states_by_zone.get(q.zone.replace("-", "_"))
        if s is not None:
            obs[q.qr_id] = s
    return Observed(obs)


def test_fan_out_one_per_zone_with_deterministic_names():
    state, eff = run(ClaimState(make_fleet()), RequestReceived(request()))
    assert sorted(c.qr.zone for c in eff.creates) == ZONES
    assert {c.qr.qr_id for c in eff.creates} == {f"tq-r1-{z}" for z in ZONES}
    assert all(c.claim for c in eff.creates)
    # Redelivery: nothing new.
    _, again = run(state, RequestReceived(request()))
    assert again.creates == [] and again.events == []


def test_zone_without_quota_and_dropped_zone_are_skipped():
    fleet = make_fleet(quota={ZONES[0]: {"v4": {"spot": 64}}, ZONES[1]: {"v4": {"on_demand": 64}}})
    _, eff = run(ClaimState(fleet), RequestReceived(request()))
    assert [c.qr.zone for c in eff.creates] == [ZONES[0]]


def test_count_caps_slices_held_not_racers_so_count_one_races_every_zone():
    fleet = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 1}])
    state, eff = run(ClaimState(fleet), RequestReceived(request()))
    assert sorted(c.qr.zone for c in eff.creates) == ZONES  # one racer per zone with quota, whatever count says


@pytest.mark.parametrize("held, creates", [
    ({}, 3),                                          # nothing held: every zone races
    ({ZONES[0]: "PROVISIONING"}, 0),                  # PROVISIONING holds a slice: count 1 is full
    ({ZONES[0]: "ACTIVE"}, 0),                        # so does ACTIVE
    ({ZONES[0]: "WAITING_FOR_RESOURCES"}, 2),         # a racer of another request holds none: the other zones race
    ({ZONES[0]: "FAILED"}, 3),                        # dead ones hold no slice (their zone's quota, which has room)
])
def test_slices_held_by_other_requests_fill_count(held, creates):
    fleet = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES, "count": 1}])
    qrs = {}
    for zone, st in held.items():
        qr = QrRecord(qr_id=f"tq-old-{zone}", fleet="f1", project="p", request_id="old", entry_id="v4", zone=zone,
                      type="v4-32", spot=True, generation=0, state=st, created_at=NOW, updated_at=NOW)
        qrs[qr.qr_id] = qr
    _, eff = run(ClaimState(fleet, qrs=qrs), RequestReceived(request()))
    assert len(eff.creates) == creates


def test_chip_quota_bounds_the_race():
    fleet = make_fleet(quota={z: {"v4": {"spot": 16}} for z in ZONES})  # one v4-32 (16 chips) per zone
    state, eff = run(ClaimState(fleet), RequestReceived(request()))
    _, eff2 = run(state, RequestReceived(request("r2")))
    assert len(eff.creates) == 3 and eff2.creates == []


def test_never_two_pending_requests_for_one_type_in_one_zone():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request("r1")))
    _, eff = run(state, RequestReceived(request("r2")))
    assert eff.creates == []


def test_capacity_failure_backs_off_the_zone_and_deletes():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    state, _ = run(state, Observed({q: Observation.found("ACCEPTED") for q in state.qrs}))
    qa = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=CAPACITY_TEXT)}))
    [event] = eff.events
    assert event.kind is FleetEventKind.failed and event.failure_class is FailureClass.capacity
    assert [d.qr.qr_id for d in eff.deletes] == [qa]
    target = state.target(ZONES[0], "v4-32")
    base = state.fleet.claim.capacity_backoff_base_seconds
    assert NOW + timedelta(seconds=base / 2) <= target.backoff_until <= NOW + timedelta(seconds=base)
    # No quick retry there: the QR goes away, the zone stays backed off.
    state, eff = run(state, Observed({qa: Observation("not_found")}))
    assert [e.kind for e in eff.events] == [FleetEventKind.gone] and eff.creates == []
    # After the back-off the race may come back to that zone, under a new generation name.
    state, eff = run(state, Observed({}), now=target.backoff_until + timedelta(seconds=1))
    assert [c.qr.qr_id for c in eff.creates] == [f"tq-r1-{ZONES[0]}-1"]


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    rng = random.Random(7)
    steps = [capacity_backoff_seconds(n, 60, 1800, rng) for n in range(1, 8)]
    for n, s in enumerate(steps, start=1):
        step = min(1800, 60 * 2 ** (n - 1))
        assert step / 2 <= s <= step


def test_zone_quota_drops_zone_until_fleet_changes():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=QUOTA_TEXT)}))
    assert state.target(ZONES[0], "v4-32").dropped(state.fleet.version)
    state, _ = run(state, Observed({qa: Observation("not_found")}))
    _, eff = run(state, Observed({}), now=NOW + timedelta(days=1))
    assert eff.creates == []
    changed = replace(state, fleet=make_fleet(claim={"valid_until_seconds": 7200}))
    _, eff = run(changed, Observed({}))
    assert [c.qr.zone for c in eff.creates] == [ZONES[0]]


def test_project_failure_blocks_every_create():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({qa: Observation("create_failed", error_code=7, error_message=BILLING_TEXT)}))
    assert state.blocked and "billing is disabled on project p" in eff.status.blocked
    _, eff = run(state, RequestReceived(request("r2", zones=[ZONES[0]])))
    assert eff.creates == []


UNKNOWN_TEXT = "An internal error has occurred. [EID: 0x00000000000000ff]"
IP_TEXT = "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region us-central2."


def _fail_until_stopped(state, message, code, observation="create_failed"):
    """Fail every create in the single zone with this error, moving the clock past each back-off; returns the
    state, the number of creates and the last back-off's length in seconds."""
    now, creates, last = NOW, 0, 0.0
    for _ in range(6):
        if not state.qrs:
            break
        [qr] = state.qrs.values()
        obs = Observation(observation, error_code=code, error_message=message) if observation == "create_failed" \
            else Observation.found("FAILED", error_code=code, error_message=message)
        state, eff = run(state, Observed({qr.qr_id: obs}), now=now)
        if observation != "create_failed":
            state, eff = run(state, Observed({qr.qr_id: Observation("not_found")}), now=now)
        target = state.target(ZONES[0], "v4-32")
        last = (target.backoff_until - now).total_seconds()
        if last > state.fleet.claim.capacity_backoff_max_seconds:
            break  # stopped: the long back-off
        now = target.backoff_until + timedelta(seconds=1)
        state, eff = run(state, Observed({}), now=now)
        creates += len(eff.creates)
    return state, creates, last


@pytest.mark.parametrize("code,message,observation", [
    (13, UNKNOWN_TEXT, "create_failed"), (13, UNKNOWN_TEXT, "failed"),
    (8, IP_TEXT, "create_failed"), (8, IP_TEXT, "failed")])
def test_unknown_and_external_ip_errors_are_retried_once_after_a_backoff_then_stopped(code, message, observation):
    one_zone = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": [ZONES[0]]}])
    state, eff = run(ClaimState(one_zone), RequestReceived(request()))
    assert len(eff.creates) == 1
    state, retries, last = _fail_until_stopped(state, message, code, observation)
    assert retries == 1  # unknown_error_retries defaults to 1
    assert last == state.fleet.claim.unknown_error_backoff_seconds == 3600
    target = state.target(ZONES[0], "v4-32")
    assert not target.dropped(state.fleet.version)  # stopped for a while, not dropped until the file changes
    # During the long back-off: nothing. After it: one more try.
    _, eff = run(state, Observed({}), now=target.backoff_until - timedelta(seconds=1))
    assert eff.creates == []
    _, eff = run(state, Observed({}), now=target.backoff_until + timedelta(seconds=1))
    assert [c.qr.zone for c in eff.creates] == [ZONES[0]]


def test_an_external_ip_refusal_backs_off_every_zone_and_type_of_its_region():
    """IN_USE_ADDRESSES is a per-region quota: the refusal in us-central2-a backs off us-central2's other zones and
    the other type with external IPs there too, on one retry count; us-east1 races on, and a type whose nodes take
    no external IP (v4-128: 16 hosts, internal IPs only under vpc) is not held back. Before, only the failing
    (zone, type) backed off, and the next pass raced the region's other zones into the same refusal."""
    zones = [*ZONES, "us-east1-d"]
    fleet = make_fleet(ssh_transport="vpc", quota={z: {"v4": {"spot": 512}} for z in zones}, tpus=[
        {"id": "v4", "type": "v4-32", "zones": zones, "count": 10},
        {"id": "small", "type": "v4-8", "zones": ZONES[1:], "count": 10},
        {"id": "big", "type": "v4-128", "zones": ZONES[:1], "count": 10}])
    state, eff = run(ClaimState(fleet), RequestReceived(request()))
    assert sorted(c.qr.zone for c in eff.creates) == zones
    failed = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({failed: Observation.found("FAILED", error_code=8, error_message=IP_TEXT)}))
    held = {(z, t) for z in ZONES for t in ("v4-32",)} | {(z, "v4-8") for z in ZONES[1:]}
    untils = {key: state.target(*key).backoff_until for key in held}
    assert len(set(untils.values())) == 1 and None not in untils.values()
    assert {key: state.target(*key).unknown_failures for key in held} == {key: 1 for key in held}
    assert all("IN_USE_ADDRESSES" in state.target(*key).last_failure_message for key in held)
    assert state.target("us-east1-d", "v4-32").backoff_until is None
    assert state.target(ZONES[0], "v4-128").backoff_until is None

    # With nothing racing, a new request races only outside the region, or a type without external IPs there.
    state = replace(state, qrs={})
    req = CapacityRequest(request_id="r2", fleet="f1", types=["v4-32", "v4-8", "v4-128"], count=1)
    state, eff = run(state, RequestReceived(req))
    assert sorted((c.qr.zone, c.qr.type) for c in eff.creates) == [(ZONES[0], "v4-128"), ("us-east1-d", "v4-32")]

    # After the back-off, the next refusal anywhere in the region is its second: the long stop, region-wide.
    later = next(iter(untils.values())) + timedelta(seconds=1)
    state, eff = run(state, Observed({}), now=later)
    retry = next(c.qr for c in eff.creates if c.qr.zone == ZONES[1])
    state, _ = run(state, Observed({retry.qr_id: Observation("create_failed", error_code=8, error_message=IP_TEXT)}),
                   now=later)
    assert {(state.target(*key).backoff_until - later).total_seconds() for key in held} == {3600}


SUBNET_TEXT = ("Cloud TPU received a bad request. Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
               "'projects/p/regions/europe-west4/subnetworks/tpu-subnet'. The referenced subnetwork resource cannot "
               "be found. [EID: 0x00000000000000ff]")


@pytest.mark.parametrize("observation", ["create_failed", "failed"])
def test_a_missing_subnet_drops_every_zone_and_type_of_its_region_with_the_command(observation):
    """Subnets are regional: a refusal of the fleet's subnetwork in europe-west4-a drops every zone and type of
    europe-west4 (one subnet for all of them) with the command that creates it, until `tpuq fleet unblock` or a
    changed fleet file; us-central2 races on. Before, it read as unknown: one blind retry, then an hour's stop
    of that one zone and type, and the region's other zones raced into the same refusal."""
    eu = ["europe-west4-a", "europe-west4-b"]
    fleet = make_fleet(network="tpu-net", subnetwork="tpu-subnet", quota=None, tpus=[
        {"id": "v4", "type": "v4-32", "zones": [ZONES[0]], "count": 10},
        {"id": "v5e", "type": "v5litepod-8", "zones": eu, "count": 10},
        {"id": "v6e", "type": "v6e-8", "zones": eu[:1], "count": 10, "single_slot": False}])
    req = CapacityRequest(request_id="r1", fleet="f1", types=["v5litepod-8", "v6e-8", "v4-32"], count=1)
    state, eff = run(ClaimState(fleet), RequestReceived(req))
    assert sorted(c.qr.zone for c in eff.creates) == sorted([ZONES[0], *eu])
    failed = f"tq-r1-{eu[0]}"
    obs = Observation("create_failed", error_code=3, error_message=SUBNET_TEXT) if observation == "create_failed" \
        else Observation.found("FAILED", error_code=3, error_message=SUBNET_TEXT)
    state, eff = run(state, Observed({failed: obs}))
    [event] = [e for e in eff.events if e.kind is FleetEventKind.failed]
    assert event.failure_class is FailureClass.network and "subnetwork resource cannot be found" in event.failure_message
    region = {(z, t) for z in eu for t in ("v5litepod-8",)} | {(eu[0], "v6e-8")}
    version = state.fleet.version
    assert all(state.target(*key).dropped(version) for key in region)
    reason = state.target(eu[1], "v5litepod-8").dropped_reason
    assert reason == state.target(eu[0], "v6e-8").dropped_reason
    assert "no subnet tpu-subnet of network tpu-net in region europe-west4" in reason and "tpuq fleet unblock" in reason
    assert ("`gcloud compute networks subnets create tpu-subnet --network=tpu-net --region=europe-west4 "
            f"--range={example_subnet_range('europe-west4')} --project=p`") in reason
    assert state.target(eu[1], "v5litepod-8").last_failure_message == event.failure_message
    assert not state.target(ZONES[0], "v4-32").dropped(version)

    # Nothing more in the region, however long: a new request races us-central2 only.
    state = replace(state, qrs={})
    _, eff = run(state, RequestReceived(CapacityRequest(request_id="r2", fleet="f1", types=req.types, count=1)),
                 now=NOW + timedelta(days=2))
    assert [(c.qr.zone, c.qr.type) for c in eff.creates] == [(ZONES[0], "v4-32")]
    # A changed fleet file (any change) lifts the drop.
    changed = replace(state, fleet=make_fleet(**{**fleet.model_dump(mode="json"), "claim": {"valid_until_seconds": 7200}}))
    _, eff = run(changed, RequestReceived(CapacityRequest(request_id="r3", fleet="f1", types=["v5litepod-8"], count=1)))
    assert sorted(c.qr.zone for c in eff.creates if c.qr.zone in eu) == eu  # r1 races there again first


def test_the_first_retry_waits_a_capacity_style_backoff_and_the_event_carries_the_raw_error():
    one_zone = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": [ZONES[0]]}])
    state, _ = run(ClaimState(one_zone), RequestReceived(request()))
    [qr] = state.qrs.values()
    state, eff = run(state, Observed({qr.qr_id: Observation("create_failed", error_code=13, error_message=UNKNOWN_TEXT)}))
    base = state.fleet.claim.capacity_backoff_base_seconds
    until = state.target(ZONES[0], "v4-32").backoff_until
    assert NOW + timedelta(seconds=base / 2) <= until <= NOW + timedelta(seconds=base)
    assert eff.creates == []
    [event] = eff.events
    assert event.failure_class is FailureClass.unknown and event.failure_message == f"{UNKNOWN_TEXT} [code 13]"


def test_external_ip_quota_event_points_at_internal_ips():
    state, _ = run(ClaimState(make_fleet(ssh_transport="direct")), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    _, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=IP_TEXT)}))
    [event] = eff.events
    assert event.failure_class is FailureClass.external_ip_quota
    assert "region us-central2" in event.failure_message and "ssh_transport: vpc" in event.failure_message
    assert IP_TEXT in event.failure_message


@pytest.mark.parametrize("message", [
    "The queued resource request expired before it could be provisioned (validUntilTime 2026-01-01T12:00:00Z).",
    UNKNOWN_TEXT,  # an undocumented text: the claimer's own clock says the request lived its validUntil window
])
def test_expired_request_is_requested_again_in_the_same_zone_without_penalty(message):
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    later = NOW + timedelta(seconds=state.fleet.claim.valid_until_seconds + 5)
    state, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=4, error_message=message)}),
                     now=later)
    assert [e.failure_class for e in eff.events] == [FailureClass.expired]
    assert [d.qr.qr_id for d in eff.deletes] == [qa]
    target = state.target(ZONES[0], "v4-32")
    assert target.backoff_until is None and not target.dropped(state.fleet.version)
    assert target.capacity_failures == 0 and target.unknown_failures == 0
    # Requested again at once in that zone (the quota has room beside the FAILED one, deleted in this event).
    assert [c.qr.qr_id for c in eff.creates] == [f"tq-r1-{ZONES[0]}-1"]


def test_an_unknown_error_early_in_the_window_is_not_expired():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    _, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=13, error_message=UNKNOWN_TEXT)}),
                 now=NOW + timedelta(minutes=5))
    assert [e.failure_class for e in eff.events] == [FailureClass.unknown]


def test_error_info_decides_before_the_text():
    from tpuq.contracts.errors import ErrorInfo

    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    billing = ErrorInfo("BILLING_DISABLED", "googleapis.com", (("consumer", "projects/p"),))
    state, eff = run(state, Observed({qa: Observation("create_failed", error_code=8, error_message="refused",
                                                      error_info=billing)}))
    assert [e.failure_class for e in eff.events] == [FailureClass.project] and state.blocked


def test_active_announced_once_with_endpoints_and_losers_cancelled():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    state, _ = run(state, Observed({q: Observation.found("WAITING_FOR_RESOURCES") for q in state.qrs}))
    qa, qb, qc = (f"tq-r1-{z}" for z in ZONES)
    node = NodeInfo(f"projects/p/locations/{ZONES[0]}/nodes/{qa}",
                    (WorkerEndpoint(worker_id=0, ip="127.0.0.2", port=2222),))
    state, eff = run(state, Observed({qa: Observation.found("ACTIVE", node=node),
                                      qb: Observation.found("PROVISIONING"),
                                      qc: Observation.found("WAITING_FOR_RESOURCES")}))
    active = [e for e in eff.events if e.kind is FleetEventKind.active]
    assert len(active) == 1 and active[0].endpoints[0].port == 2222 and active[0].chips == 16
    assert active[0].node == node.name and active[0].hosts == 4
    # Satisfied: the waiting loser is deleted, the PROVISIONING one never is.
    assert [d.qr.qr_id for d in eff.deletes] == [qc]
    state, eff = run(state, Observed({qa: Observation.found("ACTIVE"), qb: Observation.found("PROVISIONING")}))
    assert eff.events == [] and eff.deletes == [] and eff.creates == []


def test_unknown_read_is_not_gone():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    state, _ = run(state, Observed({q: Observation.found("ACCEPTED") for q in state.qrs}))
    _, eff = run(state, Observed({q: Observation("unknown") for q in state.qrs}))
    assert eff.events == [] and eff.qrs == {}


def test_requested_but_not_found_finishes_the_create_without_a_new_claim():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    assert state.qrs[qa].state == REQUESTED
    _, eff = run(state, Observed({qa: Observation("not_found")}))
    assert [(c.qr.qr_id, c.claim) for c in eff.creates] == [(qa, False)]


def test_suspended_is_announced_and_left_to_the_janitor_then_requested_again():
    fleet = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": [ZONES[0]], "count": 1}])
    state, _ = run(ClaimState(fleet), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    node = NodeInfo(f"projects/p/locations/{ZONES[0]}/nodes/{qa}")
    state, _ = run(state, Observed({qa: Observation.found("ACTIVE", node=node)}))
    state, eff = run(state, Observed({qa: Observation.found("SUSPENDED")}))
    assert [e.kind for e in eff.events] == [FleetEventKind.suspended]
    assert eff.deletes == []  # one owner: the janitor deletes a SUSPENDED one (within the event it gets)
    # It holds no slice any more (count caps PROVISIONING and ACTIVE): the open request races again at once.
    assert [c.qr.qr_id for c in eff.creates] == [f"{qa}-1"]
    state, eff = run(state, Observed({qa: Observation.found("SUSPENDED")}))
    assert eff.deletes == [] and eff.events == [] and eff.creates == []
    state, eff = run(state, Observed({qa: Observation("not_found")}))
    assert [e.kind for e in eff.events] == [FleetEventKind.gone] and eff.creates == []


def test_withdraw_never_deletes_a_suspended_one():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    state, _ = run(state, Observed({qa: Observation.found("SUSPENDED")}))
    _, eff = run(state, RequestReceived(request(action=CapacityAction.withdraw)))
    assert qa not in [d.qr.qr_id for d in eff.deletes]


def test_withdraw_deletes_waiting_but_not_active_or_provisioning():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request(count=3)))
    qa, qb, qc = (f"tq-r1-{z}" for z in ZONES)
    node = NodeInfo(f"projects/p/locations/{ZONES[0]}/nodes/{qa}")
    state, _ = run(state, Observed({qa: Observation.found("ACTIVE", node=node),
                                    qb: Observation.found("PROVISIONING"),
                                    qc: Observation.found("WAITING_FOR_RESOURCES")}))
    state, eff = run(state, RequestReceived(request(count=3, action=CapacityAction.withdraw)))
    assert [d.qr.qr_id for d in eff.deletes] == [qc]
    assert state.requests["r1"].status == "withdrawn"
    _, eff = run(state, RequestReceived(request(count=3)))  # a late request message does not reopen it
    assert eff.creates == []


def test_long_names_stay_within_api_limits_and_deterministic():
    rid = "r" * 41
    name = queued_resource_id("owner-prefix-twenty", rid, "northamerica-northeast1-a", 12)
    assert len(name) <= 63 and name.startswith("owner-prefix-twenty-") and name.endswith("-a-12")
    assert name == queued_resource_id("owner-prefix-twenty", rid, "northamerica-northeast1-a", 12)


@pytest.mark.parametrize("claim,field", [
    ({"unknown_error_backoff_seconds": -1}, "claim.unknown_error_backoff_seconds"),
    ({"unknown_error_backoff_seconds": "soon"}, "claim.unknown_error_backoff_seconds"),
    ({"unknown_error_retries": -1}, "claim.unknown_error_retries"),
])
def test_unknown_error_settings_are_validated_with_the_field_named(claim, field):
    from pydantic import ValidationError

    from tpuq.contracts.errors import describe_validation_error

    with pytest.raises(ValidationError) as e:
        make_fleet(claim=claim)
    assert describe_validation_error(e.value)[0] == field


def test_unknown_error_settings_default_as_the_quickstart_says_and_the_example_fleet_sets_them():
    import yaml

    from tpuq.operations.examples import EXAMPLE_FLEET

    claim = make_fleet().claim
    assert (claim.unknown_error_retries, claim.unknown_error_backoff_seconds) == (1, 3600)
    example = FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET)).claim
    assert (example.unknown_error_retries, example.unknown_error_backoff_seconds) == (1, 3600)


def test_a_shorter_unknown_error_backoff_is_used():
    fleet = make_fleet(tpus=[{"id": "v4", "type": "v4-32", "zones": [ZONES[0]]}],
                       claim={"unknown_error_retries": 0, "unknown_error_backoff_seconds": 120})
    state, _ = run(ClaimState(fleet), RequestReceived(request()))
    [qr] = state.qrs.values()
    state, _ = run(state, Observed({qr.qr_id: Observation("create_failed", error_code=13,
                                                          error_message=UNKNOWN_TEXT)}))
    assert state.target(ZONES[0], "v4-32").backoff_until == NOW + timedelta(seconds=120)


def test_failed_is_classified_and_its_class_recorded_before_the_claimer_deletes_it():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    _, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=CAPACITY_TEXT)}))
    # The record written with this decision is the janitor's licence to delete it too (tpuq.janitor.decide).
    assert (eff.qrs[qa].state, eff.qrs[qa].failure_class) == ("FAILED", "capacity")
    assert [d.qr.qr_id for d in eff.deletes] == [qa] and eff.deletes[0].qr.failure_class == "capacity"


# ------------------------------------------------------------ single-slot types

def single_slot_fleet(**v6e) -> FleetFile:
    return make_fleet(
        quota={z: {"v4": {"spot": 64}, "v6e": {"spot": 64}} for z in ZONES},
        tpus=[{"id": "v4", "type": "v4-32", "zones": ZONES[:2], "count": 10},
              {"id": "v6e", "type": "v6e-8", "zones": ZONES, "count": 10, **v6e}])


def typed(rid: str, *types: str, **kw) -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="f1", types=list(types), count=1, **kw)


@pytest.mark.parametrize("v6e, creates", [
    ({}, [("v6e-8", ZONES[0])]),                                   # default: v6e is single-slot
    ({"single_slot": True}, [("v6e-8", ZONES[0])]),
    ({"single_slot": False}, [("v6e-8", z) for z in ZONES]),       # turned off: fans out like any type
])
def test_single_slot_type_is_requested_one_at_a_time(v6e, creates):
    state, eff = run(ClaimState(single_slot_fleet(**v6e)), RequestReceived(typed("r1", "v6e-8")))
    assert sorted((c.qr.type, c.qr.zone) for c in eff.creates) == creates


def test_single_slot_one_request_in_the_whole_fleet_then_the_next_zone_after_a_stockout():
    state, eff = run(ClaimState(single_slot_fleet()), RequestReceived(typed("r1", "v6e-8")))
    [first] = eff.creates
    state, eff = run(state, RequestReceived(typed("r2", "v6e-8")))
    assert eff.creates == []  # another request's single-slot racer is out: wait for it
    state, eff = run(state, Observed({first.qr.qr_id: Observation.found("FAILED", error_code=8,
                                                                         error_message=CAPACITY_TEXT)}))
    # The stocked-out zone backs off; the one racer moves to the next zone at once (the oldest request first).
    assert [(c.qr.request_id, c.qr.zone) for c in eff.creates] == [("r1", ZONES[1])]
    state, eff = run(state, Observed({first.qr.qr_id: Observation("not_found")}))
    assert eff.creates == []


@pytest.mark.parametrize("types", [("v4-32", "v6e-8"), ("v6e-8", "v4-32")])
def test_single_slot_type_is_not_raced_alongside_other_types(types):
    state, eff = run(ClaimState(single_slot_fleet()), RequestReceived(typed("r1", *types)))
    assert sorted((c.qr.type, c.qr.zone) for c in eff.creates) == [("v4-32", ZONES[0]), ("v4-32", ZONES[1])]
    # Both v4 zones stocked out and backed off: now the v6e gets its one racer, alone.
    for c in eff.creates:
        state, _ = run(state, Observed({c.qr.qr_id: Observation.found("FAILED", error_code=8,
                                                                      error_message=CAPACITY_TEXT)}))
        state, _ = run(state, Observed({c.qr.qr_id: Observation("not_found")}))
    assert sorted((q.type, q.zone) for q in state.qrs.values() if q.pending) == [("v6e-8", ZONES[0])]


@pytest.mark.parametrize("tpu_type, setting, single", [
    ("v6e-8", None, True), ("v6e-64", None, True), ("v4-32", None, False), ("v5litepod-8", None, False),
    ("v6e-8", False, False), ("v4-32", True, True),
])
def test_single_slot_setting_defaults_on_for_v6e_only(tpu_type, setting, single):
    entry = {"id": "e", "type": tpu_type, "zones": [ZONES[0]]}
    if setting is not None:
        entry["single_slot"] = setting
    assert make_fleet(quota=None, tpus=[entry]).tpus[0].is_single_slot is single


def test_single_slot_setting_is_validated():
    with pytest.raises(ValueError, match="single_slot"):
        make_fleet(tpus=[{"id": "e", "type": "v6e-8", "zones": [ZONES[0]], "single_slot": "maybe"}])


def test_capacity_granted_in_one_zone_cancels_the_queued_racers_at_once():
    state, _ = run(ClaimState(make_fleet()), RequestReceived(request()))
    qa, qb, qc = (f"tq-r1-{z}" for z in ZONES)
    state, eff = run(state, Observed({qa: Observation.found("PROVISIONING"),
                                      qb: Observation.found("WAITING_FOR_RESOURCES"),
                                      qc: Observation.found("ACCEPTED")}))
    assert sorted(d.qr.qr_id for d in eff.deletes) == [qb, qc] and eff.creates == []
    # Redelivered: nothing more. The PROVISIONING one is never sent a delete.
    _, again = run(state, Observed({qa: Observation.found("PROVISIONING")}))
    assert again.deletes == [] and again.creates == []
    # It fails: the request races again, in the other zones (the failed zone backs off).
    state, _ = run(state, Observed({qb: Observation("not_found"), qc: Observation("not_found")}))
    _, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=CAPACITY_TEXT)}))
    assert sorted(c.qr.zone for c in eff.creates) == ZONES[1:]


def test_hedged_race_starts_in_one_zone_and_adds_one_after_each_hedge():
    fleet = make_fleet(claim={"hedge_seconds": 120})
    state, eff = run(ClaimState(fleet), RequestReceived(request()))
    assert [c.qr.zone for c in eff.creates] == ZONES[:1]
    qa = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({qa: Observation.found("WAITING_FOR_RESOURCES")}),
                     now=NOW + timedelta(seconds=119))
    assert eff.creates == []
    state, eff = run(state, Observed({qa: Observation.found("WAITING_FOR_RESOURCES")}),
                     now=NOW + timedelta(seconds=120))
    assert [c.qr.zone for c in eff.creates] == [ZONES[1]]
    # The hedge counts from the newest racer.
    _, eff = run(state, Observed({}), now=NOW + timedelta(seconds=200))
    assert eff.creates == []
    _, eff = run(state, Observed({}), now=NOW + timedelta(seconds=240))
    assert [c.qr.zone for c in eff.creates] == [ZONES[2]]


def test_hedged_race_moves_to_the_next_zone_at_once_after_a_stockout():
    state, _ = run(ClaimState(make_fleet(claim={"hedge_seconds": 600})), RequestReceived(request()))
    qa = f"tq-r1-{ZONES[0]}"
    state, eff = run(state, Observed({qa: Observation.found("FAILED", error_code=8, error_message=CAPACITY_TEXT)}),
                     now=NOW + timedelta(seconds=30))
    assert [c.qr.zone for c in eff.creates] == [ZONES[1]]


@pytest.mark.parametrize("value", [-1, 86401, "soon"])
def test_hedge_setting_is_validated_with_the_field_named(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="hedge_seconds"):
        make_fleet(claim={"hedge_seconds": value})


def test_hedged_race_for_two_slices_starts_in_two_zones():
    state, eff = run(ClaimState(make_fleet(claim={"hedge_seconds": 600})), RequestReceived(request(count=2)))
    assert [c.qr.zone for c in eff.creates] == ZONES[:2]
    qa, qb = (f"tq-r1-{z}" for z in ZONES[:2])
    # One is granted: the other still races for the second slice; no third zone before the hedge.
    state, eff = run(state, Observed({qa: Observation.found("PROVISIONING"),
                                      qb: Observation.found("WAITING_FOR_RESOURCES")}),
                     now=NOW + timedelta(seconds=60))
    assert eff.creates == [] and eff.deletes == []
    _, eff = run(state, Observed({}), now=NOW + timedelta(seconds=600))
    assert [c.qr.zone for c in eff.creates] == [ZONES[2]]
