"""classify() against the real error texts (cloud-tpu-facts.md and the fake's renderings of them)."""

import pytest

from tpuq.claimer.classify import classify, project_block_reason
from tpuq.messages import FailureClass

CASES = [
    # capacity
    (8, 'There is no more capacity in the zone "us-central2-b"; you can try in another zone where Cloud TPU '
        "Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1a2b3c4d5e6f7081]",
     FailureClass.capacity),
    (None, "GCE_STOCKOUT", FailureClass.capacity),
    (13, "Cloud TPU received a bad response from GCE: ZONE_RESOURCE_POOL_EXHAUSTED", FailureClass.capacity),
    (9, "Insufficient reserved capacity. [EID: 0x0000000000000001]", FailureClass.capacity),
    # zone quota: code 8 too, told apart by the message
    (8, "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone "
        "us-central2-b.", FailureClass.zone_quota),
    (8, "Quota 'TPUV5sLitepodPerProjectPerZoneForTPUAPI' exhausted. Limit 32 in zone us-west4-a",
     FailureClass.zone_quota),
    (8, "RESOURCE_EXHAUSTED", FailureClass.zone_quota),
    (None, "429 quota exceeded for TPUV6EPerProjectPerZoneForTPUAPI", FailureClass.zone_quota),
    # project
    (7, "Permission 'tpu.queuedResources.create' denied on resource 'projects/p/locations/us-central2-b' "
        "(or it may not exist).", FailureClass.project),
    (7, "Billing account for project 'p' is not found. Billing must be enabled for activation of service(s) "
        "'tpu.googleapis.com' to proceed.", FailureClass.project),
    (None, "PERMISSION_DENIED", FailureClass.project),
    (9, "billingEnabled: false", FailureClass.project),
    (None, "NO_VALID_BILLING_ACCOUNT", FailureClass.project),
    # unknown
    (13, "An internal error has occurred. [EID: 0x00000000000000ff]", FailureClass.unknown),
    (4, "The queued resource request expired before it could be provisioned (validUntilTime 2025-01-01T00:00Z).",
     FailureClass.unknown),
    (8, "", FailureClass.unknown),  # code 8 alone says nothing: capacity and quota share it
    (None, None, FailureClass.unknown),
]


@pytest.mark.parametrize("code,message,expected", CASES)
def test_classify_real_texts(code, message, expected):
    assert classify(code, message) is expected


def test_block_reason_names_billing_and_project():
    reason = project_block_reason("proj-x", "Billing account for project 'proj-x' is not found.")
    assert reason.startswith("billing is disabled on project proj-x")
