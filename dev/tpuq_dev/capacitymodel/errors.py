"""The fake's error catalogue: google.rpc codes, API errors as the HTTP layer renders them, and the
failedData.error texts the real API writes when a queued resource fails (by failure class)."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

from tpuq.contracts.errors import ERROR_INFO_TYPE, QUOTA_FAILURE_TYPE  # the detail types the claimer reads, spelled once
from tpuq.contracts.tputypes import ProvisioningModel, QuotaIds
from tpuq.contracts.tputypes import family as family_row

# google.rpc.Code values
RPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INTERNAL": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


@dataclass(frozen=True)
class RpcStatus:
    """A google.rpc.Status: the error of a failed queued resource or operation, or of an HTTP call."""

    status: str  # canonical name, e.g. RESOURCE_EXHAUSTED
    message: str
    details: tuple[dict, ...] = ()

    @property
    def code(self) -> int:
        return RPC_CODES[self.status]

    def to_json(self) -> dict:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = list(self.details)
        return body


class ApiError(Exception):
    """A synchronous API error: the HTTP layer renders it as {error:{code,message,status,details}}."""

    def __init__(self, status: str, message: str, details: tuple[dict, ...] = ()):
        super().__init__(message)
        self.rpc = RpcStatus(status, message, details)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.rpc.status, 500)

    def to_json(self) -> dict:
        return {
            "error": {
                "code": self.http_status,
                "message": self.rpc.message,
                "status": self.rpc.status,
                "details": list(self.rpc.details),
            }
        }


def error_info(reason: str, domain: str = "googleapis.com", **metadata: str) -> dict:
    return {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": domain, "metadata": metadata}



def invalid(message: str, field_name: str | None = None) -> ApiError:
    details: tuple[dict, ...] = ()
    if field_name:
        details = (
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": field_name, "description": message}],
            },
        )
    return ApiError("INVALID_ARGUMENT", message, details)



# -- failure classes (failedData.error texts as the real API writes them) -------------------
# Which of them carry a google.rpc.ErrorInfo, and why (sources in README.md, "Errors and their details"):
# billing and permission refusals do (Service Infrastructure's BILLING_DISABLED, IAM's IAM_PERMISSION_DENIED);
# a synchronous quota 429 carries a google.rpc.QuotaFailure and no ErrorInfo; a stockout's failedData.error
# has code and message only. For the rest (failedData quota, external IPs, expiry, internal errors) no public
# record shows details, so the fake sends none: the claimer must classify them by their text.

ERROR_CLASSES = ("capacity", "quota", "reserved", "billing", "permission", "external_ips", "expired", "unknown")


def _eid(rng: random.Random) -> str:
    return f"[EID: 0x{rng.getrandbits(64):016x}]"


def _quota_ids(family: str, spot: bool) -> QuotaIds:
    return family_row(family).quota[ProvisioningModel.spot if spot else ProvisioningModel.on_demand]


def quota_id(family: str, spot: bool) -> str:
    """The per-zone Cloud Quotas id the real API names in quota errors (the catalogue's, `tpuq.contracts.tputypes`)."""
    return _quota_ids(family, spot).zone


def capacity_error(zone: str, rng: random.Random) -> RpcStatus:
    return RpcStatus(
        "RESOURCE_EXHAUSTED",
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes '
        f"are offered (see https://cloud.google.com/tpu/docs/regions) {_eid(rng)}",
    )


def quota_error(zone: str, family: str, spot: bool, limit: int) -> RpcStatus:
    return RpcStatus(
        "RESOURCE_EXHAUSTED",
        f"Quota limit '{quota_id(family, spot)}' has been exceeded. Limit: {limit} in zone {zone}.",
    )


def region_quota_id(family: str, spot: bool) -> str:
    """The per-region Cloud Quotas id next to the per-zone one (marin#87 names TPUV4sPreemptiblePodPerProjectPerRegion-
    ForTPUAPI; production-facts.md); where the catalogue knows none, the per-zone one's name with PerRegion."""
    ids = _quota_ids(family, spot)
    return ids.region or ids.zone.replace("PerZone", "PerRegion")


def region_quota_error(region: str, family: str, spot: bool, limit: int) -> RpcStatus:
    """A per-region quota refusal, worded as the per-zone one with the region (BioMedBERT/biomedbert's gcloud log:
    "Quota limit '...PerRegion...' has been exceeded. Limit: 0 ... in region us-central1")."""
    return RpcStatus(
        "RESOURCE_EXHAUSTED",
        f"Quota limit '{region_quota_id(family, spot)}' has been exceeded. Limit: {limit} in region {region}.",
    )


def quota_api_error(zone: str, family: str, spot: bool, limit: int, project_number: str = "0") -> ApiError:
    """A synchronous quota refusal as the real API sends it: HTTP 429 RESOURCE_EXHAUSTED with a QuotaFailure."""
    rpc = quota_error(zone, family, spot, limit)
    violation = {"subject": f"project:{project_number}",
                 "description": f"Quota '{quota_id(family, spot)}' exhausted. Limit {limit} in zone {zone}"}
    return ApiError(rpc.status, rpc.message, ({"@type": QUOTA_FAILURE_TYPE, "violations": [violation]},))


def external_ip_error(region: str, limit: int) -> RpcStatus:
    """The region's in-use external IP quota (Compute Engine's IN_USE_ADDRESSES), as its quota texts read; the
    TPU API's own wording and code for it are not on record (README), so the class rests on the text."""
    return RpcStatus("RESOURCE_EXHAUSTED", f"Quota 'IN_USE_ADDRESSES' exceeded. Limit: {float(limit)} in region {region}.")


def permission_error(project: str, zone: str, permission: str = "tpu.queuedResources.create") -> RpcStatus:
    return RpcStatus(
        "PERMISSION_DENIED",
        f"Permission '{permission}' denied on resource '//tpu.googleapis.com/projects/{project}/locations/{zone}' "
        f"(or it may not exist).",
        (error_info("IAM_PERMISSION_DENIED", "tpu.googleapis.com",
                    resource=f"projects/{project}/locations/{zone}", permission=permission),),
    )


def reserved_error(rng: random.Random) -> RpcStatus:
    return RpcStatus("FAILED_PRECONDITION", f"Insufficient reserved capacity. {_eid(rng)}")


def billing_error(project: str) -> RpcStatus:
    return RpcStatus(
        "PERMISSION_DENIED",
        f"Billing account for project '{project}' is not found. Billing must be enabled for activation of "
        f"service(s) 'tpu.googleapis.com' to proceed.",
        (
            error_info(
                "BILLING_DISABLED",
                consumer=f"projects/{project}",
                service="tpu.googleapis.com",
                activationUrl=f"https://console.cloud.google.com/billing/enable?project={project}",
            ),
        ),
    )


def subnetwork_error(project: str, region: str, subnetwork: str, network: str | None = None) -> ApiError:
    """A TPU create refused for its networkConfig: the subnet is not in the node's region (subnets are regional), or
    (with `network`) it is another network's; synchronous, 400 INVALID_ARGUMENT, no details. The TPU API's own words
    are not on record. These are Compute Engine's, which creates the TPU VMs (an instance insert naming a missing
    subnet: "Invalid value for field 'resource.networkInterfaces[0].subnetwork': '...'. The referenced subnetwork
    resource cannot be found.", terraform-provider-google#2140; one of another network: 'Subnetwork "..." is not valid
    for Network "N".', #7895), after the TPU API's "Cloud TPU received a bad request." that its other INVALID_ARGUMENT
    refusals open with (an unknown accelerator type's, in public gcloud logs)."""
    path = f"projects/{project}/regions/{region}/subnetworks/{subnetwork}"
    eid = _eid(random.Random(zlib.crc32(path.encode())))
    if network is not None:
        detail = f'Subnetwork "{path}" is not valid for Network "{network}".'
    else:
        detail = (f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{path}'. The referenced "
                  "subnetwork resource cannot be found.")
    return ApiError("INVALID_ARGUMENT", f"Cloud TPU received a bad request. {detail} {eid}")


def unknown_error(rng: random.Random) -> RpcStatus:
    return RpcStatus("INTERNAL", f"An internal error has occurred. {_eid(rng)}")


def expired_error(valid_until_wall: str) -> RpcStatus:
    # The real text is not on record (the API reference only says a FAILED request may be "due to unavailability
    # of resources within the constraints of the request (e.g., the 'valid until' start timing constraint
    # expired)"). The claimer therefore also reads expiry from its own clock, never from this text alone.
    return RpcStatus(
        "DEADLINE_EXCEEDED",
        f"The queued resource request expired before it could be provisioned (validUntilTime {valid_until_wall}).",
    )


def failure_for_class(error_class: str, *, project: str, zone: str, family: str, spot: bool, rng,
                      wall: str = "", external_ip_limit: int = 8) -> RpcStatus:
    if error_class == "capacity":
        return capacity_error(zone, rng)
    if error_class == "quota":
        return quota_error(zone, family, spot, 0)
    if error_class == "reserved":
        return reserved_error(rng)
    if error_class == "billing":
        return billing_error(project)
    if error_class == "permission":
        return permission_error(project, zone)
    if error_class == "external_ips":
        return external_ip_error(zone.rsplit("-", 1)[0], external_ip_limit)
    if error_class == "expired":
        return expired_error(wall)
    if error_class == "unknown":
        return unknown_error(rng)
    raise ValueError(f"unknown error class {error_class!r}; expected one of {', '.join(ERROR_CLASSES)}")
