"""Core (pure, no I/O): which failure class a Cloud TPU error belongs to, table-tested against real texts.

The class decides what the claimer does (see `tpuq.claimer.decide`):
- capacity:   delete, back off that zone (exponential, jittered), race elsewhere;
- zone_quota: drop that zone and type until the fleet file changes;
- project:    stop creating anywhere and surface the reason;
- unknown:    a few retries, then treated as zone quota.

Cloud TPU reuses code 8 (RESOURCE_EXHAUSTED) for both "no more capacity" and
some quota texts, so the message decides, not the code alone. This module and
`tpuq.errors.from_api_error` are the only places that read error strings.
"""

from __future__ import annotations

import re

from tpuq.messages import FailureClass

# google.rpc.Code values that matter here.
CODE_PERMISSION_DENIED = 7
CODE_RESOURCE_EXHAUSTED = 8
CODE_FAILED_PRECONDITION = 9
CODE_UNAUTHENTICATED = 16

_PROJECT = re.compile(
    r"permission_denied|permission .* denied|billing|no_valid_billing_account|service_disabled"
    r"|has not been used in project|api .* is disabled|consumer_suspended|project .* (?:is|has been) suspended",
    re.IGNORECASE,
)
_CAPACITY = re.compile(
    r"no more capacity|gce_stockout|stockout|zone_resource_pool_exhausted|resource_pool_exhausted"
    r"|insufficient (?:reserved )?capacity|not have enough resources available",
    re.IGNORECASE,
)
_QUOTA = re.compile(
    r"quota|limit:? \d+ in (?:zone|region)|resource_exhausted|resource exhausted",
    re.IGNORECASE,
)


def classify(code: int | None, message: str | None) -> FailureClass:
    """The failure class of an error (a QR's failedData.error, or a synchronous create error)."""
    text = message or ""
    if _PROJECT.search(text) or code in (CODE_PERMISSION_DENIED, CODE_UNAUTHENTICATED):
        return FailureClass.project
    if _CAPACITY.search(text):
        return FailureClass.capacity
    if _QUOTA.search(text):
        return FailureClass.zone_quota
    return FailureClass.unknown


def project_block_reason(project: str, message: str | None) -> str:
    """A one-line reason a person can act on, shown by `tpuq fleet` and in waiting jobs' status."""
    text = (message or "").strip()
    lowered = text.lower()
    if "billing" in lowered:
        headline = f"billing is disabled on project {project}"
    elif "permission" in lowered:
        headline = f"permission denied on project {project}"
    elif "has not been used" in lowered or "service_disabled" in lowered or "is disabled" in lowered:
        headline = f"the Cloud TPU API is disabled on project {project}"
    else:
        headline = f"project {project} refuses new TPUs"
    return f"{headline}: {text}" if text else headline
