"""classify(): structure (ErrorInfo, QuotaFailure) first, the message next, the code last; every real error text in
../shared/reference/cloud-tpu-facts.md, production-facts.md and the TRC quickstart, and what the API sends with them."""

from __future__ import annotations

import json

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from tpuq.claimer.classify import classify, describe_failure, project_block_reason, raw_error
from tpuq.contracts.errors import ErrorInfo, error_info_from_details, error_info_of, status_error_info
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import FailureClass as F

EID = "[EID: 0x1a2b3c4d5e6f7081]"
# Texts only: what the real API writes in failedData.error (code, message), where no details are known to come.
TEXTS = [
    # capacity (cloud-tpu-facts "capacity", the quickstart's "capacité")
    (8, 'There is no more capacity in the zone "us-central2-b"; you can try in another zone where Cloud TPU '
        f"Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {EID}", F.capacity),
    (None, "GCE_STOCKOUT", F.capacity),
    (13, "Cloud TPU received a bad response from GCE: ZONE_RESOURCE_POOL_EXHAUSTED", F.capacity),
    # reserved: "like capacity" (cloud-tpu-facts), code 9
    (9, f"Insufficient reserved capacity. {EID}", F.capacity),
    (9, "Insufficient reserved capacity. Contact customer support to increase your reservation. [EID: 0x2f8bc266e]",
     F.capacity),
    # zone quota: code 8 too, told apart by the message
    (8, "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone "
        "us-central2-b.", F.zone_quota),
    (8, "Quota 'TPUV5sLitepodPerProjectPerZoneForTPUAPI' exhausted. Limit 32 in zone us-west4-a", F.zone_quota),
    (8, "Quota limit 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 4 in zone us-east5-a.",
     F.zone_quota),
    (8, "RESOURCE_EXHAUSTED", F.zone_quota),  # the quickstart's "structurel"
    (None, "Limit: 0", F.zone_quota),  # a bare "Limit: 0" (quickstart), no zone named
    (None, "Limit : 0", F.zone_quota),  # as the quickstart prints it
    (None, "429 quota exceeded for TPUV6EPerProjectPerZoneForTPUAPI", F.zone_quota),
    # external IP quota (production-facts, quickstart §4): a regional quota, not the TPU grant
    (8, "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region us-central2.", F.external_ip_quota),
    (None, "IN_USE_ADDRESSES limit", F.external_ip_quota),
    (3, "Insufficient regional quota to satisfy request: resource \"IN_USE_ADDRESSES\": request requires '16.0' and "
        "is short '8.0'. project has a quota of '8.0' with '8.0' available.", F.external_ip_quota),
    # expired (validUntil reached). The real text is not documented; the fake's, and what such a text may say.
    (4, "The queued resource request expired before it could be provisioned (validUntilTime 2025-01-01T00:00Z).",
     F.expired),
    (None, "Request expired: the 'valid until' start timing constraint was reached", F.expired),
    # project
    (7, "Permission 'tpu.queuedResources.create' denied on resource 'projects/p/locations/us-central2-b' "
        "(or it may not exist).", F.project),
    (7, "Billing account for project 'p' is not found. Billing must be enabled for activation of service(s) "
        "'tpu.googleapis.com' to proceed.", F.project),
    (None, "PERMISSION_DENIED", F.project),
    (None, "PERMISSION_DENIED: billing", F.project),
    (9, "billingEnabled: false", F.project),
    (None, "billingEnabled : false", F.project),
    (None, "NO_VALID_BILLING_ACCOUNT", F.project),
    (7, "Cloud TPU API has not been used in project 123 before or it is disabled.", F.project),
    # network: the node's subnet is not in its region (subnets are regional) or is another network's. The TPU API's
    # words are not on record: Compute Engine's (which creates the VMs), bare or in the TPU API's bad-request wrapper
    # (the fake's), in the REST client's "400 POST url: " form too.
    (3, "Cloud TPU received a bad request. Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
        f"'projects/p/regions/europe-west4/subnetworks/tpu-subnet'. The referenced subnetwork resource cannot be found. "
        f"{EID}", F.network),
    (None, "400 POST http://127.0.0.1:1/v2/projects/p/locations/europe-west4-a/queuedResources?queuedResourceId=q: "
           "Cloud TPU received a bad request. Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
           "'https://www.googleapis.com/compute/v1/projects/p/regions/europe-west4/subnetworks/s'. The referenced "
           "subnetwork resource cannot be found.", F.network),
    (5, "The resource 'projects/p/regions/europe-west4/subnetworks/tpu-subnet' was not found", F.network),
    (3, 'Subnetwork "projects/p/regions/asia-northeast1/subnetworks/hoge-vpc-subnet" is not valid for Network '
        '"hoge-vpc".', F.network),
    (3, "Invalid value for field 'resource.networkInterfaces[0]': ''. Subnetwork should be specified for custom "
        "subnetmode network", F.network),
    # ... and a bad request about something else stays unknown (a real text: an accelerator the zone lacks)
    (3, 'Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, "v6e-1", '
        'could not be found in the zonal accelerator configurations for "asia-east1-a".; the accelerator v6e-1 was '
        f"not found in zone asia-east1-a {EID}", F.unknown),
    # unknown
    (13, f"An internal error has occurred. {EID}", F.unknown),
    (13, "TPU operation failed: an internal error", F.unknown),
    (2, "Something nobody has seen before", F.unknown),
    # the code settles only what the text leaves open
    (8, "", F.unknown),  # code 8 alone says nothing: capacity and quota share it
    (8, None, F.unknown),
    (7, "", F.project),
    (16, None, F.project),
    (None, None, F.unknown),
]


@pytest.mark.parametrize("code,message,expected", TEXTS)
def test_text_path_classifies_every_real_text(code, message, expected):
    assert classify(code, message) is expected
    # No details, or details whose reason we do not know: the text decides just the same.
    assert classify(code, message, ErrorInfo(reason="SOMETHING_NEW", domain="tpu.googleapis.com")) is expected


def info(reason=None, domain="googleapis.com", violations=(), **metadata) -> ErrorInfo:
    return ErrorInfo(reason, domain, tuple(sorted(metadata.items())), tuple(violations))


STRUCTURED = [
    # Service Infrastructure's reasons (google.api.ErrorReason, domain googleapis.com): sent by every Google API.
    (info("BILLING_DISABLED", consumer="projects/p", service="tpu.googleapis.com"), F.project),
    (info("SERVICE_DISABLED", consumer="projects/p", service="tpu.googleapis.com"), F.project),
    (info("CONSUMER_SUSPENDED", consumer="projects/p"), F.project),
    (info("IAM_PERMISSION_DENIED", "iam.googleapis.com", permission="tpu.queuedResources.create"), F.project),
    (info("IAM_PERMISSION_DENIED", "tpu.googleapis.com", permission="tpu.queuedResources.create"), F.project),
    (info("RESOURCE_QUOTA_EXCEEDED", quota_limit="TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI"), F.zone_quota),
    (info("QUOTA_EXCEEDED", "compute.googleapis.com", quotaResource="IN_USE_ADDRESSES", region="us-central2"),
     F.external_ip_quota),
    (info("ZONE_RESOURCE_POOL_EXHAUSTED", "compute.googleapis.com"), F.capacity),
    # google.rpc.QuotaFailure, as the real API sends with a synchronous quota 429
    (info(violations=("project:1037372895180", "Quota 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' exhausted. "
                      "Limit 4 in zone us-east5-a")), F.zone_quota),
    (info(violations=("project:1", "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region us-central2")),
     F.external_ip_quota),
]


@pytest.mark.parametrize("details,expected", STRUCTURED)
def test_structure_decides_before_the_text(details, expected):
    # A message that would say otherwise (or nothing): the structure wins.
    assert classify(8, 'There is no more capacity in the zone "z"', details) is expected
    assert classify(None, None, details) is expected


def test_a_reason_from_another_domain_is_not_taken_for_service_infrastructures():
    # BILLING_DISABLED means "project blocked" in domain googleapis.com only; elsewhere the text decides.
    assert classify(8, 'There is no more capacity in the zone "z"', info("BILLING_DISABLED", "example.com")) \
        is F.capacity


@pytest.mark.parametrize("code,message,first", [
    (13, "An internal error has occurred.", F.unknown),
    (8, 'There is no more capacity in the zone "z"', F.capacity),
    (None, None, F.unknown),
])
def test_a_request_that_lived_its_valid_until_window_expired(code, message, first):
    assert classify(code, message) is first
    assert classify(code, message, past_valid_until=True) is F.expired


@pytest.mark.parametrize("message", [
    "Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone z.",
    "Billing account for project 'p' is not found.",
])
def test_quota_and_project_stay_what_they_are_past_valid_until(message):
    assert classify(8, message, past_valid_until=True) is classify(8, message)


# ---- carrying the details from the API's errors


def _http_error(status: int, body: dict) -> gexc.GoogleAPICallError:
    class Response:
        status_code = status
        request = None

        def json(self):
            return body

    return gexc.format_http_response_error(Response(), "POST", "https://tpu.googleapis.com/v2/x", body)


def test_rest_error_info_is_carried_from_the_exception():
    body = {"error": {"code": 403, "status": "PERMISSION_DENIED",
                      "message": "Billing account for project 'p' is not found.",
                      "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "BILLING_DISABLED",
                                   "domain": "googleapis.com",
                                   "metadata": {"consumer": "projects/p", "service": "tpu.googleapis.com"}}]}}
    exc = _http_error(403, body)
    assert exc.reason == "BILLING_DISABLED"
    got = error_info_of(exc)
    assert got.reason == "BILLING_DISABLED" and got.domain == "googleapis.com"
    assert got.meta("service") == "tpu.googleapis.com"


def test_rest_quota_failure_is_carried_from_the_exception():
    # The real synchronous quota error: HTTP 429 with a QuotaFailure and no ErrorInfo.
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
                      "message": "Quota limit 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' has been exceeded. "
                                 "Limit: 4 in zone us-east5-a.",
                      "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                                   "violations": [{"subject": "project:1037372895180",
                                                   "description": "Quota 'X' exhausted. Limit 4 in zone us-east5-a"}]}]}}
    got = error_info_of(_http_error(429, body))
    assert got.reason is None and got.quota_violations == ("project:1037372895180",
                                                           "Quota 'X' exhausted. Limit 4 in zone us-east5-a")
    assert classify(8, None, got) is F.zone_quota


def test_no_details_no_info():
    assert error_info_of(_http_error(500, {"error": {"code": 500, "message": "boom"}})) is None
    assert error_info_from_details([{"@type": "type.googleapis.com/google.rpc.DebugInfo", "detail": "x"}]) is None


def test_failed_data_status_details_are_read_from_protobuf_anys():
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="BILLING_DISABLED", domain="googleapis.com",
                                            metadata={"consumer": "projects/p"}))
    quota = any_pb2.Any()
    quota.Pack(error_details_pb2.QuotaFailure(violations=[
        error_details_pb2.QuotaFailure.Violation(subject="project:1", description="Quota 'IN_USE_ADDRESSES'")]))
    status = status_pb2.Status(code=7, message="m", details=[detail, quota])
    got = status_error_info(status)
    assert (got.reason, got.domain, got.metadata) == ("BILLING_DISABLED", "googleapis.com",
                                                      (("consumer", "projects/p"),))
    assert got.quota_violations == ("project:1", "Quota 'IN_USE_ADDRESSES'")
    assert status_error_info(status_pb2.Status(code=8, message="no details")) is None


def test_failed_data_details_survive_the_tpu_clients_rest_parsing():
    """The JSON the REST transport parses into QueuedResource: an ErrorInfo in failedData.error reaches us."""
    from google.protobuf import json_format
    from google.cloud import tpu_v2

    body = {"name": "x", "state": {"state": "FAILED", "failedData": {"error": {
        "code": 7, "message": "m", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                                 "reason": "BILLING_DISABLED", "domain": "googleapis.com"}]}}}}
    pb = tpu_v2.QueuedResource.pb(tpu_v2.QueuedResource())
    json_format.Parse(json.dumps(body), pb, ignore_unknown_fields=True)
    error = tpu_v2.QueuedResource.wrap(pb).state.failed_data.error
    assert status_error_info(error).reason == "BILLING_DISABLED"


# ---- what people are shown


def test_raw_error_keeps_message_code_and_reason():
    assert raw_error(13, "An internal error has occurred.") == "An internal error has occurred. [code 13]"
    assert raw_error(7, "denied", info("BILLING_DISABLED")) == "denied [code 7, reason BILLING_DISABLED (googleapis.com)]"
    assert raw_error(None, None) == "(no message)"


@pytest.mark.parametrize("transport,expected", [("direct", "ssh_transport: vpc"), ("vpc", "worker_external_ips: false")])
def test_external_ip_quota_points_at_internal_ips(transport, expected):
    fleet = FleetFile.model_validate({"name": "f", "project": "p", "ssh_transport": transport,
                                      "tpus": [{"id": "a", "type": "v4-32", "zones": ["us-central2-b"]}]})
    text = describe_failure(F.external_ip_quota, 8, "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region "
                            "us-central2.", None, fleet, "us-central2")
    assert "IN_USE_ADDRESSES" in text and "region us-central2" in text and expected in text
    assert text.endswith("The API said: Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region us-central2. [code 8]")


def test_block_reason_names_billing_and_project():
    reason = project_block_reason("proj-x", "Billing account for project 'proj-x' is not found.")
    assert reason.startswith("billing is disabled on project proj-x")
