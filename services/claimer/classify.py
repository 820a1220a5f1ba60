"""Core (pure, no I/O): which failure class a Cloud TPU error belongs to, table-tested against real texts.

The class decides what the claimer does (see `tpuq.claimer.decide`):
- capacity:          delete, back off that zone (exponential, jittered), race elsewhere;
- zone_quota:        drop that zone and type until the fleet file changes;
- external_ip_quota: the region's external IP quota (IN_USE_ADDRESSES); like unknown, and the message says to
                     use internal IPs (`ssh_transport: vpc`, `worker_external_ips: false`);
- expired:           validUntil reached while queued: request again in the same zone, no penalty;
- project:           stop creating anywhere and surface the reason;
- network:           the fleet's subnetwork is not in the node's region (subnets are regional; a custom-mode network
                     has only the subnets its owner made): every create in that region fails alike until a person
                     creates it, so the region is dropped (every zone and type, until the fleet file changes or
                     `tpuq fleet unblock`) with the command that creates it, never retried blind;
- unknown:           one retry after a back-off, then that target is stopped for a long back-off.

Order of evidence, most trusted first:
1. structure: the `google.rpc.ErrorInfo` reason and domain, and a `google.rpc.QuotaFailure`, carried from the API
   error into the observation (`tpuq.contracts.errors.ErrorInfo`). The real API does not attach them to every failure (a
   stockout's failedData.error has code and message only), so a reason is never required: it only decides when
   it is one we know;
2. the message patterns below (the real texts are in the table test);
3. the status code, only to settle what the text leaves open. Cloud TPU uses code 8 (RESOURCE_EXHAUSTED) for both
   "no more capacity" and quota texts, so code 8 alone decides nothing.
`past_valid_until` (the request lived its whole validUntil window, which the claimer knows from its own create)
turns a capacity or unknown reading into `expired`: the real expiry text is not documented, and the clock is ours.

This module and `tpuq.contracts.errors.from_api_error` are the only places that read error strings.
"""

from __future__ import annotations

import re
from enum import Enum

from tpuq.contracts.errors import REASON_RESOURCE_QUOTA_EXCEEDED, ErrorInfo
from tpuq.contracts.fleet import FleetFile, SshTransport
from tpuq.contracts.messages import FailureClass

# google.rpc.Code values that matter here.
CODE_DEADLINE_EXCEEDED = 4
CODE_PERMISSION_DENIED = 7
CODE_RESOURCE_EXHAUSTED = 8
CODE_FAILED_PRECONDITION = 9
CODE_UNAUTHENTICATED = 16

# Service Infrastructure's reasons (domain googleapis.com, google.api.ErrorReason) that mean the project itself
# is refused: no zone or type can help, a person must act.
_PROJECT_REASONS = frozenset({
    "SERVICE_DISABLED", "BILLING_DISABLED", "CONSUMER_SUSPENDED", "CONSUMER_INVALID", "USER_PROJECT_DENIED",
    "API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED", "ACCESS_TOKEN_EXPIRED", "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
    "SERVICE_NOT_VISIBLE", "ORG_RESTRICTION_VIOLATION", "LOCATION_TAX_POLICY_VIOLATION", "SECURITY_POLICY_VIOLATED",
})
_SERVICE_INFRA_DOMAIN = "googleapis.com"
# Reasons services send under their own domain (IAM's from iam.googleapis.com or the called service's).
_PERMISSION_REASONS = frozenset({"IAM_PERMISSION_DENIED", "PERMISSION_DENIED"})
_QUOTA_REASONS = frozenset({REASON_RESOURCE_QUOTA_EXCEEDED, "QUOTA_EXCEEDED"})
_CAPACITY_REASONS = frozenset({"STOCKOUT", "GCE_STOCKOUT", "ZONE_RESOURCE_POOL_EXHAUSTED", "RESOURCE_POOL_EXHAUSTED"})

_PROJECT = re.compile(
    r"permission_denied|permission .* denied|billing|no_valid_billing_account|service_disabled"
    r"|has not been used in project|api .* is disabled|consumer_suspended|project .* (?:is|has been) suspended",
    re.IGNORECASE,
)
# A node's subnetwork missing in its region, or of another network. The TPU API's own wording is not on record; these
# are Compute Engine's, which creates the TPU VMs (a subnets.get 404 "The resource '.../subnetworks/S' was not found",
# an instance insert's "... The referenced subnetwork resource cannot be found.", terraform-provider-google#2140;
# "Subnetwork \"...\" is not valid for Network \"N\".", #7895; "Subnetwork should be specified for custom subnetmode
# network", GoogleCloudDataproc/bdutil#88), so any of them, wrapped in the TPU API's "Cloud TPU received a bad
# request." or not, reads as this class.
_SUBNETWORK = re.compile(
    r"subnetworks?\b[^.]{0,200}?\b(?:not found|cannot be found|could not be found|does not exist"
    r"|is not valid for network)|subnetwork should be specified",
    re.IGNORECASE,
)
_EXTERNAL_IPS = re.compile(r"in_use_addresses|in-use ip addresses|external ip(?: address)?(?:es)? quota", re.IGNORECASE)
_EXPIRED = re.compile(
    r"valid.?until|(?:request|queued resource)\b[^.]*\bexpired|\bexpired\b[^.]*\b(?:request|queued|valid)",
    re.IGNORECASE,
)
_CAPACITY = re.compile(
    r"no more capacity|gce_stockout|stockout|zone_resource_pool_exhausted|resource_pool_exhausted"
    r"|insufficient (?:reserved )?capacity|not have enough resources available",
    re.IGNORECASE,
)
_QUOTA = re.compile(
    r"quota|\blimit\s*:?\s*\d+(?:\.\d+)?\b|resource_exhausted|resource exhausted",
    re.IGNORECASE,
)


def classify(code: int | None, message: str | None, info: ErrorInfo | None = None, *,
             past_valid_until: bool = False) -> FailureClass:
    """The failure class of an error (a QR's failedData.error, or a synchronous create error)."""
    found = _from_structure(info) or _from_text(message or "") or _from_code(code)
    if past_valid_until and found in (FailureClass.capacity, FailureClass.unknown):
        return FailureClass.expired
    return found


def _from_structure(info: ErrorInfo | None) -> FailureClass | None:
    if info is None:
        return None
    reason = (info.reason or "").upper()
    domain = (info.domain or "").lower()
    mentions = " ".join((reason, *(v for _, v in info.metadata), *info.quota_violations))
    if reason in _PROJECT_REASONS and domain == _SERVICE_INFRA_DOMAIN:
        return FailureClass.project
    if reason in _PERMISSION_REASONS and domain.endswith(_SERVICE_INFRA_DOMAIN):
        return FailureClass.project
    if reason in _CAPACITY_REASONS:
        return FailureClass.capacity
    if reason in _QUOTA_REASONS or info.quota_violations:
        return FailureClass.external_ip_quota if _EXTERNAL_IPS.search(mentions) else FailureClass.zone_quota
    return None  # a reason we do not know (or none): the text decides


def _from_text(text: str) -> FailureClass | None:
    if _PROJECT.search(text):
        return FailureClass.project
    if _SUBNETWORK.search(text):
        return FailureClass.network
    if _EXTERNAL_IPS.search(text):
        return FailureClass.external_ip_quota  # before quota: its text reads "Quota 'IN_USE_ADDRESSES' exceeded"
    if _EXPIRED.search(text):
        return FailureClass.expired
    if _CAPACITY.search(text):
        return FailureClass.capacity
    if _QUOTA.search(text):
        return FailureClass.zone_quota
    return None


def _from_code(code: int | None) -> FailureClass:
    if code in (CODE_PERMISSION_DENIED, CODE_UNAUTHENTICATED):
        return FailureClass.project
    return FailureClass.unknown  # code 8 included: capacity and quota share it


def raw_error(code: int | None, message: str | None, info: ErrorInfo | None = None) -> str:
    """The API's error as a person should see it: message, code, and the ErrorInfo reason when there is one."""
    parts = [(message or "").strip() or "(no message)"]
    extra = [f"code {code}"] if code is not None else []
    if info is not None and info.reason:
        extra.append(f"reason {info.reason}" + (f" ({info.domain})" if info.domain else ""))
    if extra:
        parts.append(f"[{', '.join(extra)}]")
    return " ".join(parts)


def external_ip_hint(fleet: FleetFile | None, region: str | None) -> str:
    """What to change when a region's external IP quota (IN_USE_ADDRESSES, 8 by default) refuses a slice."""
    where = f"region {region}'s" if region else "the region's"
    head = f"{where} external IP quota (IN_USE_ADDRESSES, 8 per region by default) is used up"
    if fleet is not None and fleet.ssh_transport is SshTransport.direct:
        fix = "use internal IPs: set `ssh_transport: vpc` in the fleet file (docs/DEPLOYING.md, 'External IPs and NAT')"
    else:
        fix = ("use internal IPs: with `ssh_transport: vpc`, set `worker_external_ips: false` once the region has "
               "Cloud NAT (docs/DEPLOYING.md, 'External IPs and NAT')")
    return f"{head}; {fix}"


def describe_failure(failure: FailureClass, code: int | None, message: str | None, info: ErrorInfo | None = None,
                     fleet: FleetFile | None = None, region: str | None = None) -> str:
    """The sentence `tpuq fleet` and the waiting jobs show: the raw error, with what to do where we know it."""
    raw = raw_error(code, message, info)
    if failure is FailureClass.external_ip_quota:
        return f"{external_ip_hint(fleet, region)}. The API said: {raw}"
    return raw


class BlockKind(str, Enum):
    """Why a whole project refuses new TPUs (never stored: read from the refusal's text each time)."""

    billing = "billing"
    permission = "permission"
    api_disabled = "api_disabled"
    suspended = "suspended"
    other = "other"


def block_kind(message: str | None) -> BlockKind:
    """The kind of a project-level refusal, from the API's error as `raw_error` wrote it (message, code, reason)."""
    lowered = (message or "").lower()
    if "billing" in lowered:
        return BlockKind.billing
    if "service_disabled" in lowered or "has not been used" in lowered or re.search(r"api .*is disabled", lowered):
        return BlockKind.api_disabled
    if "suspended" in lowered:
        return BlockKind.suspended
    if "permission" in lowered or "code 7]" in lowered or "code 16]" in lowered:
        return BlockKind.permission
    return BlockKind.other


def project_block_reason(project: str, message: str | None) -> str:
    """A short reason a person can act on, with exactly what to run, shown by `tpuq fleet` and waiting jobs. The
    API's own error is kept beside it (`FleetStatus.blocked_message`: `--verbose`, `--json`)."""
    from tpuq.capacity.quota import billing_block_reason

    kind = block_kind(message)
    if kind is BlockKind.billing:
        return billing_block_reason(project)
    if kind is BlockKind.api_disabled:
        return (f"the Cloud TPU API is disabled on project {project}: run `gcloud services enable tpu.googleapis.com "
                f"--project {project}`, then `{UNBLOCK}`")
    if kind is BlockKind.permission:
        return (f"tpuq's claimer may not create TPUs in project {project}: grant "
                f"tpuq-claimer@{project}.iam.gserviceaccount.com roles/tpu.admin (`tpuq deploy` does), then run "
                f"`{UNBLOCK}`")
    if kind is BlockKind.suspended:
        return f"project {project} is suspended: resolve it in the Google Cloud console, then run `{UNBLOCK}`"
    return f"project {project} refuses new TPUs (`tpuq fleet --verbose` shows why): fix it, then run `{UNBLOCK}`"


def zone_quota_reason(zone: str, tpu_type: str, tier: str) -> str:
    """A zone dropped for want of quota (until the fleet file changes or `tpuq fleet unblock`); the API's text is
    the target's `last_failure_message` (`--verbose`)."""
    return (f"no {tier} quota for {tpu_type} in {zone}: raise it or take the zone out of the fleet file, then run "
            f"`{UNBLOCK}` (or `tpuq fleet apply` the changed file)")


def subnet_reason(fleet: FleetFile, region: str) -> str:
    """A region dropped because the TPU API refused the fleet's subnetwork there (until the fleet file changes or
    `tpuq fleet unblock`); the API's text is the targets' `last_failure_message` (`--verbose`)."""
    from tpuq.capacity.subnets import subnet_create_command

    return (f"no subnet {fleet.subnetwork} of network {fleet.network} in region {region} (subnets are regional: every "
            f"region of the fleet's zones needs one): the project owner runs `{subnet_create_command(fleet, region)}` "
            f"(any free range), then `{UNBLOCK}`; or take {region}'s zones out of the fleet file")


UNBLOCK = "tpuq fleet unblock"
