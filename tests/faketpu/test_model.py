"""The fake Cloud TPU's state machine, driven by a manual clock and a seeded RNG (no HTTP, no hosts)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tpuq_dev.capacitymodel.clock import ManualClock
from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.model import FakeTpuWorld, NodeState, QrState
from tpuq_dev.capacitymodel.scenario import parse_scenario

P, Z, Z2 = "proj", "us-central2-b", "europe-west4-a"


def world(extra: dict | None = None, **zones) -> tuple[FakeTpuWorld, ManualClock]:
    data = {
        "zones": zones or {Z: {"quota": {"v4": {"spot": 32, "on_demand": 16}}}, Z2: {}},
        "delays": {"accepted": 1, "waiting": 5, "provisioning": 100, "suspending": 30, "deleting": 5},
    }
    data.update(extra or {})
    clock = ManualClock()
    return FakeTpuWorld(parse_scenario(data), clock, random.Random(7)), clock


def body(node_id="n1", accelerator="v4-32", tier="spot", valid_until=None, metadata=None) -> dict:
    b: dict = {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": f"projects/{P}/locations/{Z}",
                    "nodeId": node_id,
                    "node": {
                        "acceleratorType": accelerator,
                        "runtimeVersion": "tpu-ubuntu2204-base",
                        "metadata": metadata or {},
                    },
                }
            ]
        },
        tier: {},
    }
    if valid_until:
        b["queueingPolicy"] = {"validUntilDuration": valid_until}
    return b


def create(w, qr_id="qr1", zone=Z, **kw):
    b = body(**kw)
    b["tpu"]["nodeSpec"][0]["parent"] = f"projects/{P}/locations/{zone}"
    return w.create_queued_resource(P, zone, qr_id, b, None)


def state(w, qr_id="qr1", zone=Z) -> QrState:
    return w.get_queued_resource(P, zone, qr_id).state


def test_normal_path_goes_through_every_state_at_its_scheduled_time():
    w, clock = world()
    op = create(w)
    assert op.done and op.response.state == QrState.ACCEPTED
    assert state(w) == QrState.ACCEPTED
    clock.advance(1)
    assert state(w) == QrState.WAITING_FOR_RESOURCES
    clock.advance(5)
    assert state(w) == QrState.PROVISIONING
    assert w.get_node(P, Z, "n1").state == NodeState.CREATING
    clock.advance(100)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.ACTIVE and qr.state_since == 106
    node = w.get_node(P, Z, "n1")
    assert node.state == NodeState.READY and len(node.endpoints) == 4  # v4-32 has 4 hosts


def test_a_long_pause_replays_transitions_at_their_own_times():
    w, clock = world()
    create(w)
    clock.advance(10_000)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.ACTIVE and qr.state_since == 106


def test_hosts_required_keeps_provisioning_until_hosts_started():
    w, clock = world()
    w.hosts_required = True
    create(w)
    clock.advance(200)
    assert state(w) == QrState.PROVISIONING
    [node] = w.nodes_awaiting_hosts()
    from tpuq_dev.capacitymodel.model import Endpoint

    assert w.hosts_started(node.name, (Endpoint("127.0.9.9", 22),))
    assert state(w) == QrState.ACTIVE
    assert w.get_node(P, Z, "n1").endpoints[0].ip_address == "127.0.9.9"


def test_no_quota_fails_with_the_real_quota_text_and_holds_nothing():
    w, clock = world()
    create(w, zone=Z2)
    clock.advance(1)
    qr = w.get_queued_resource(P, Z2, "qr1")
    assert qr.state == QrState.FAILED
    assert qr.failed_error.code == 8 and qr.failed_error.status == "RESOURCE_EXHAUSTED"
    assert qr.failed_error.message == (
        f"Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone {Z2}."
    )
    assert w.quota_used(P, Z2, "v4", "spot") == 0


def test_a_region_quota_is_shared_by_its_zones_and_minus_one_is_unlimited():
    """us-central2-a and -c list no v4 quota: us-central2's 16 chips bound them together; us-central2-b's own -1 is
    unlimited, but the region's quota still binds it (both are enforced)."""
    za, zb, zc = "us-central2-a", "us-central2-b", "us-central2-c"
    w, clock = world({"region_quota": {"us-central2": {"v4": {"spot": 16}}}},
                     **{za: {}, zb: {"quota": {"v4": {"spot": -1}}}, zc: {}})
    create(w, "a", zone=za, node_id="na", accelerator="v4-32")  # 16 chips: the whole region's
    create(w, "c", zone=zc, node_id="nc", accelerator="v4-8")
    clock.advance(1)
    assert state(w, "a", za) == QrState.WAITING_FOR_RESOURCES
    assert w.get_queued_resource(P, zc, "c").failed_error.message == (
        "Quota limit 'TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI' has been exceeded. Limit: 16 in region "
        "us-central2.")
    w.delete_queued_resource(P, za, "a")
    clock.advance(10)
    create(w, "b", zone=zb, node_id="nb", accelerator="v4-8")
    clock.advance(1)
    assert state(w, "b", zb) == QrState.WAITING_FOR_RESOURCES  # -1 in the zone, 4 of the region's 16


def test_quota_is_held_by_failed_suspended_and_live_requests_until_deleted():
    w, clock = world()
    create(w, "a", node_id="na", accelerator="v4-32")  # 16 chips of 32 spot
    create(w, "b", node_id="nb", accelerator="v4-32")  # 16 more: exactly the limit
    create(w, "c", node_id="nc", accelerator="v4-8")  # 4 more: over
    clock.advance(1)
    assert state(w, "c") == QrState.FAILED and "Limit: 32" in w.get_queued_resource(P, Z, "c").failed_error.message
    assert w.quota_used(P, Z, "v4", "spot") == 32
    # a fails for capacity later; b is preempted: both still hold quota.
    w.fail_queued_resource(P, Z, "a", "capacity")
    clock.advance(200)
    w.preempt_node(P, Z, "nb")
    clock.advance(100)
    assert state(w, "b") == QrState.SUSPENDED
    assert w.get_node(P, Z, "nb").state == NodeState.PREEMPTED
    assert w.quota_used(P, Z, "v4", "spot") == 32
    w.delete_queued_resource(P, Z, "a")
    assert w.quota_used(P, Z, "v4", "spot") == 32  # DELETING still holds
    clock.advance(5)
    assert w.quota_used(P, Z, "v4", "spot") == 16
    # guaranteed requests draw from the on-demand quota
    create(w, "d", node_id="nd", tier="guaranteed", accelerator="v4-32")
    clock.advance(1)
    assert state(w, "d") == QrState.WAITING_FOR_RESOURCES
    assert w.quota_used(P, Z, "v4", "on_demand") == 16


def test_stockout_fail_gives_the_real_capacity_text():
    w, clock = world({"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"family": "v4", "start": 0, "end": 50}]}}})
    create(w)
    clock.advance(6)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.FAILED and qr.failed_error.code == 8
    assert qr.failed_error.message.startswith(
        f'There is no more capacity in the zone "{Z}"; you can try in another zone where Cloud TPU Nodes are offered '
        "(see https://cloud.google.com/tpu/docs/regions) [EID: 0x"
    )


def test_stockout_wait_holds_in_waiting_until_the_window_ends():
    w, clock = world(
        {"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"start": 0, "end": 50, "effect": "wait"}]}}}
    )
    create(w)
    clock.advance(40)
    assert state(w) == QrState.WAITING_FOR_RESOURCES
    clock.advance(20)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.PROVISIONING and qr.state_since == 50


def test_control_stockout_override_wins_over_the_scenario():
    w, clock = world()
    w.set_stockout(Z, "v4", True)
    create(w)
    clock.advance(6)
    assert state(w) == QrState.FAILED
    w.set_stockout(Z, "v4", None)
    create(w, "qr2", node_id="n2")
    clock.advance(6)
    assert state(w, "qr2") == QrState.PROVISIONING


def test_valid_until_duration_expires_an_unprovisioned_request():
    w, clock = world(
        {"zones": {Z: {"quota": {"v4": {"spot": 32}}, "stockouts": [{"start": 0, "effect": "wait"}]}}}
    )
    create(w, valid_until="30s")
    clock.advance(29)
    assert state(w) == QrState.WAITING_FOR_RESOURCES
    clock.advance(100)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.FAILED and qr.state_since == 30
    assert qr.failed_error.status == "DEADLINE_EXCEEDED"


def test_scripted_preemption_at_absolute_time_hits_only_active_spot_nodes():
    w, clock = world({"preemption": {"scripted": [{"at": 150, "family": "v4"}]}})
    create(w)
    create(w, "g", node_id="ng", tier="guaranteed", accelerator="v4-8")
    clock.advance(149)
    assert state(w) == QrState.ACTIVE
    clock.advance(1)
    qr = w.get_queued_resource(P, Z, "qr1")
    assert qr.state == QrState.SUSPENDING and qr.initiator == "SERVICE"
    assert w.get_node(P, Z, "n1").state == NodeState.PREEMPTED
    assert state(w, "g") == QrState.ACTIVE
    clock.advance(30)
    assert state(w) == QrState.SUSPENDED


def test_mean_lifetime_preemption_is_reproducible_from_the_seed():
    def preempted_at() -> float:
        w, clock = world({"preemption": {"mean_spot_lifetime": 500}})
        create(w)
        clock.advance(100_000)
        return w.get_queued_resource(P, Z, "qr1").state_since

    first = preempted_at()
    assert first > 106 and first == preempted_at()


def test_after_active_preemption():
    w, clock = world({"preemption": {"scripted": [{"after_active": 10, "node_id": "n1"}]}})
    create(w)
    clock.advance(115)
    assert state(w) == QrState.ACTIVE
    clock.advance(1)
    assert state(w) == QrState.SUSPENDING


def test_delete_rules():
    w, clock = world()
    create(w)
    clock.advance(6)
    with pytest.raises(ApiError) as e:
        w.delete_queued_resource(P, Z, "qr1", force=True)
    assert e.value.rpc.status == "FAILED_PRECONDITION" and e.value.http_status == 400
    assert str(e.value) == "DeleteQueuedResource is not supported when state is PROVISIONING"
    clock.advance(100)
    with pytest.raises(ApiError) as e:
        w.delete_queued_resource(P, Z, "qr1")
    assert e.value.rpc.status == "FAILED_PRECONDITION"
    op = w.delete_queued_resource(P, Z, "qr1", force=True)
    assert not op.done and state(w) == QrState.DELETING
    assert w.get_node(P, Z, "n1").state == NodeState.DELETING
    clock.advance(5)
    assert w.get_operation(P, Z, op.op_id).done
    with pytest.raises(ApiError) as e:
        w.get_queued_resource(P, Z, "qr1")
    assert e.value.http_status == 404
    with pytest.raises(ApiError):
        w.get_node(P, Z, "n1")


def test_accepted_and_failed_requests_delete_without_force():
    w, clock = world()
    create(w)
    w.delete_queued_resource(P, Z, "qr1")
    create(w, "f", zone=Z2, node_id="nf")
    clock.advance(1)
    assert state(w, "f", Z2) == QrState.FAILED
    w.delete_queued_resource(P, Z2, "f")
    clock.advance(5)
    assert w.list_queued_resources(P, Z)[0] == [] and w.list_queued_resources(P, Z2)[0] == []


def test_reset_puts_a_suspended_request_back_in_the_queue():
    w, clock = world()
    create(w)
    clock.advance(106)
    w.preempt_node(P, Z, "n1")
    clock.advance(30)
    w.reset_queued_resource(P, Z, "qr1")
    assert state(w) == QrState.ACCEPTED
    clock.advance(106)
    assert state(w) == QrState.ACTIVE


def test_request_id_returns_the_same_operation_and_duplicates_conflict():
    w, _ = world()
    first = w.create_queued_resource(P, Z, "qr1", body(), "req-1")
    again = w.create_queued_resource(P, Z, "qr1", body(), "req-1")
    assert again is first and len(w.queued_resources) == 1
    with pytest.raises(ApiError) as e:
        w.create_queued_resource(P, Z, "qr1", body(), "req-2")
    assert e.value.http_status == 409 and e.value.rpc.status == "ALREADY_EXISTS"


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda b: b.pop("tpu"), "nodeSpec"),
        (lambda b: b["tpu"]["nodeSpec"][0]["node"].update(acceleratorType="v9-8"), "acceleratorType"),
        (lambda b: b["tpu"]["nodeSpec"][0].update(nodeId="Bad_Id"), "nodeId"),
        (lambda b: b.update(guaranteed={}), "Only one of"),
        (lambda b: b.update(queueingPolicy={"validUntilDuration": "soon"}), "duration"),
        (lambda b: b.update(queueingPolicy={"validUntilDuration": "0s"}), "validUntilDuration must be positive"),
        (lambda b: b.update(queueingPolicy={"validUntilTime": "tomorrow"}), "RFC 3339"),
        (lambda b: b.update(queueingPolicy={"validUntilTime": "2025-01-01T00:00:03"}), "time zone"),
        (lambda b: b["tpu"]["nodeSpec"].append(b["tpu"]["nodeSpec"][0]), "exactly one node spec"),
        (lambda b: b["tpu"]["nodeSpec"][0].update(parent="projects/other/locations/x"), "does not match"),
        (lambda b: b["tpu"]["nodeSpec"][0]["node"].pop("runtimeVersion"), "runtimeVersion is required"),
        (lambda b: b["tpu"]["nodeSpec"][0]["node"].update(metadata={"n": 1}), "metadata must map strings"),
    ],
)
def test_malformed_creates_are_invalid_argument(mutate, fragment):
    w, _ = world()
    b = body()
    mutate(b)
    with pytest.raises(ApiError) as e:
        w.create_queued_resource(P, Z, "qr1", b, None)
    assert e.value.http_status == 400 and e.value.rpc.status == "INVALID_ARGUMENT"
    assert fragment in str(e.value)


@pytest.mark.parametrize("qr_id", [None, "", "Upper", "1-starts-with-a-digit", "ends-with-", "under_score", "x" * 64])
def test_queued_resource_ids_outside_the_api_rules_are_invalid_argument(qr_id):
    w, _ = world()
    with pytest.raises(ApiError) as e:
        w.create_queued_resource(P, Z, qr_id, body(), None)
    assert e.value.rpc.status == "INVALID_ARGUMENT"
    assert e.value.rpc.details[0]["fieldViolations"][0]["field"] == "queued_resource_id"


@pytest.mark.parametrize("qr_id", ["a", "a-1", "x" * 63])
def test_queued_resource_ids_within_the_api_rules_are_accepted(qr_id):
    w, _ = world()
    assert w.create_queued_resource(P, Z, qr_id, body(), None).done


def test_multislice_params_with_a_node_id_are_invalid():
    """multisliceParams is given "instead of node_id" (tpu_v2 MultisliceParams); more in test_multislice.py."""
    w, _ = world()
    b = body()
    b["tpu"]["nodeSpec"][0]["multisliceParams"] = {"nodeCount": 2}
    with pytest.raises(ApiError) as e:
        w.create_queued_resource(P, Z, "qr1", b, None)
    assert (e.value.rpc.status, e.value.http_status) == ("INVALID_ARGUMENT", 400)


@pytest.mark.parametrize(
    "error_class, status, code, starts_with",
    [
        ("capacity", "RESOURCE_EXHAUSTED", 8, f'There is no more capacity in the zone "{Z}"'),
        ("quota", "RESOURCE_EXHAUSTED", 8, "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded."),
        ("reserved", "FAILED_PRECONDITION", 9, "Insufficient reserved capacity."),
        ("billing", "PERMISSION_DENIED", 7, f"Billing account for project '{P}' is not found."),
        ("unknown", "INTERNAL", 13, "An internal error has occurred."),
        ("permission", "PERMISSION_DENIED", 7, "Permission 'tpu.queuedResources.create' denied on resource"),
        ("external_ips", "RESOURCE_EXHAUSTED", 8, "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region"),
        ("expired", "DEADLINE_EXCEEDED", 4, "The queued resource request expired"),
    ],
)
def test_failing_a_request_by_class_writes_that_class_s_error(error_class, status, code, starts_with):
    w, _ = world()
    create(w)
    qr = w.fail_queued_resource(P, Z, "qr1", error_class)
    assert (qr.state, qr.initiator) == (QrState.FAILED, "SERVICE")
    assert (qr.failed_error.status, qr.failed_error.code) == (status, code)
    assert qr.failed_error.message.startswith(starts_with)


def test_failing_a_request_with_an_unknown_class_is_invalid_argument():
    w, _ = world()
    create(w)
    with pytest.raises(ApiError) as e:
        w.fail_queued_resource(P, Z, "qr1", "meteor")
    assert e.value.rpc.status == "INVALID_ARGUMENT" and "capacity, quota, reserved, billing" in str(e.value)
    assert state(w) == QrState.ACCEPTED


def test_billing_disabled_blocks_every_call_with_billing_disabled_reason():
    w, _ = world({"billing": {"disabled": True}})
    with pytest.raises(ApiError) as e:
        w.check_call(P, Z)
    assert e.value.http_status == 403 and e.value.rpc.status == "PERMISSION_DENIED"
    assert e.value.rpc.message.startswith(f"Billing account for project '{P}' is not found.")
    assert e.value.rpc.details[0]["reason"] == "BILLING_DISABLED"
    w.set_billing(P, True)
    w.check_call(P, Z)


def test_paging():
    w, _ = world()
    for i in range(5):
        create(w, f"q{i}", node_id=f"n{i}", accelerator="v4-8")
    page, token = w.list_queued_resources(P, Z, 2, "")
    seen = [q.qr_id for q in page]
    while token:
        page, token = w.list_queued_resources(P, Z, 2, token)
        seen += [q.qr_id for q in page]
    assert seen == [f"q{i}" for i in range(5)]


def test_valid_until_time_is_kept_relative_to_the_clock():
    w, clock = world()
    b = body(tier="guaranteed")
    b["queueingPolicy"] = {"validUntilTime": "2025-01-01T00:00:03Z"}  # ManualClock starts at 2025-01-01T00:00:00Z
    w.create_queued_resource(P, Z, "timed", b, None)
    assert w.get_queued_resource(P, Z, "timed").valid_until == 3


@pytest.mark.parametrize(
    "tier_fields, node_fields, spot",
    [
        ({"spot": {}}, {}, True),
        ({"bestEffort": {}}, {}, True),
        ({"provisioningModel": "SPOT"}, {}, True),  # gcloud alpha --provisioning-model=SPOT
        ({}, {"schedulingConfig": {"spot": True}}, True),
        ({}, {"schedulingConfig": {"preemptible": True}}, True),
        ({"guaranteed": {}}, {}, False),
        ({}, {}, False),
    ],
)
def test_spot_spellings(tier_fields, node_fields, spot):
    w, _ = world()
    b = body(tier="guaranteed")
    del b["guaranteed"]
    b.update(tier_fields)
    b["tpu"]["nodeSpec"][0]["node"].update(node_fields)
    w.create_queued_resource(P, Z, "qr1", b, None)
    assert w.get_queued_resource(P, Z, "qr1").spot is spot


def test_dash_location_lists_every_zone():
    w, _ = world({"zones": {Z: {"quota": {"v4": {"spot": 32}}}, Z2: {"quota": {"v4": {"spot": 32}}}}})
    create(w, "a", zone=Z, node_id="na")
    create(w, "b", zone=Z2, node_id="nb")
    items, token = w.list_queued_resources(P, "-")
    assert sorted(q.qr_id for q in items) == ["a", "b"] and token == ""


def test_the_state_machine_imports_without_the_http_server_or_the_worker_hosts():
    """A simulator runs the model alone: importing it must not pull in HTTP, sshd hosts or SSH clients."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys, tpuq_dev.capacitymodel.model; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    modules = json.loads(loaded.stdout)
    forbidden = ("tpuq_dev.faketpu.server", "tpuq_dev.faketpu.api", "tpuq_dev.faketpu.hosts", "tpuq_dev.faketpu.control",
                 "tpuq_dev.faketpu.measure", "flask", "werkzeug", "paramiko", "requests")
    assert [m for m in modules if m.split(".")[0] in forbidden or m in forbidden] == []


# ---- scripted failures, the external IP quota, and which errors carry details


def _info_reasons(error) -> list[str]:
    return [d.get("reason") for d in error.details if d.get("@type", "").endswith("google.rpc.ErrorInfo")]


@pytest.mark.parametrize("error_class", ["unknown", "external_ips", "permission", "capacity"])
def test_a_scripted_failure_fails_requests_at_the_capacity_check_in_its_window(error_class):
    w, clock = world(**{Z: {"quota": {"v4": {"spot": 64}},
                            "failures": [{"start": 0, "end": 100, "family": "v4", "error": error_class}]}})
    create(w)
    clock.advance(10)
    assert state(w) == QrState.FAILED
    expected = w._error_of_class(w.queued_resources[f"projects/{P}/locations/{Z}/queuedResources/qr1"],
                                 error_class, 6)
    got = w.queued_resources[f"projects/{P}/locations/{Z}/queuedResources/qr1"].failed_error
    assert (got.status, got.message[:40]) == (expected.status, expected.message[:40])
    # After the window, requests go through.
    clock.advance(100)
    create(w, "qr2", node_id="n2")
    clock.advance(10)
    assert state(w, "qr2") == QrState.PROVISIONING


def test_scripted_failure_error_class_is_validated():
    from tpuq_dev.capacitymodel.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="unknown error class 'meteor'"):
        parse_scenario({"zones": {Z: {"failures": [{"error": "meteor"}]}}})
    with pytest.raises(ScenarioError, match="not a region name"):
        parse_scenario({"network": {"external_ip_quota": {Z: 8}}})


def _with_external_ips(b: dict) -> dict:
    b["tpu"]["nodeSpec"][0]["node"]["networkConfig"] = {"enableExternalIps": True}
    return b


def test_nodes_with_external_ips_fail_past_the_regions_in_use_addresses_quota():
    region = Z.rsplit("-", 1)[0]
    other = f"{region}-x"  # another zone of the same region
    w, clock = world({"network": {"external_ip_quota": {region: 6}}},
                     **{Z: {"quota": {"v4": {"spot": 64}}}, other: {"quota": {"v4": {"spot": 64}}}})

    def create_in(zone, qr_id, external=True):
        b = body(f"n-{qr_id}")
        b["tpu"]["nodeSpec"][0]["parent"] = f"projects/{P}/locations/{zone}"
        w.create_queued_resource(P, zone, qr_id, _with_external_ips(b) if external else b, None)
        clock.advance(10)
        return w.get_queued_resource(P, zone, qr_id)

    # One v4-32 (4 hosts) with external IPs fits in 6 addresses; a second in the same region does not.
    assert create_in(Z, "qr1").state == QrState.PROVISIONING
    failed = create_in(other, "qr2")
    assert failed.state == QrState.FAILED and (failed.failed_error.code, failed.failed_error.details) == (8, ())
    assert "IN_USE_ADDRESSES" in failed.failed_error.message and f"region {region}" in failed.failed_error.message
    # Internal IPs only: no address quota taken.
    assert create_in(other, "qr3", external=False).state == QrState.PROVISIONING


def test_which_failures_carry_an_error_info():
    """As the real API: billing and permission refusals carry one; stockouts, quota, external IPs, expiry and
    internal errors do not (README, 'Errors and their details')."""
    w, _ = world()
    create(w)
    qr = w.queued_resources[f"projects/{P}/locations/{Z}/queuedResources/qr1"]
    reasons = {c: _info_reasons(w._error_of_class(qr, c, 0)) for c in
               ("capacity", "quota", "reserved", "billing", "permission", "external_ips", "expired", "unknown")}
    assert reasons == {"capacity": [], "quota": [], "reserved": [], "billing": ["BILLING_DISABLED"],
                       "permission": ["IAM_PERMISSION_DENIED"], "external_ips": [], "expired": [], "unknown": []}


def test_a_synchronous_quota_fault_is_the_real_429_with_a_quota_failure():
    from tpuq_dev.capacitymodel.model import ApiCallFault

    w, _ = world()
    w.add_fault(ApiCallFault(status="UNAVAILABLE", message="", error_class="quota"))
    with pytest.raises(ApiError) as e:
        w.check_call(P, Z, "POST", f"/v2/projects/{P}/locations/{Z}/queuedResources")
    assert (e.value.rpc.status, e.value.http_status) == ("RESOURCE_EXHAUSTED", 429)
    [detail] = e.value.rpc.details
    assert detail["@type"] == "type.googleapis.com/google.rpc.QuotaFailure"
    assert "Limit 0 in zone" in detail["violations"][0]["description"]
