"""Blocked reasons are short, human, and say exactly what to run; the API's own error is kept beside them. A
billing block clears by itself once Cloud Billing reports billing enabled; the others name `tpuq fleet unblock`."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from tpuq.claimer.classify import BlockKind, block_kind, project_block_reason, raw_error, zone_quota_reason
from tpuq.claimer.decide import decide_observed
from tpuq.claimer.model import ClaimState, FleetStatus, Observed
from tpuq.contracts.errors import ErrorInfo
from tpuq.contracts.fleet import FleetFile
from tpuq.capacity.quota import BILLING_OFF_MESSAGE, BillingState, EffectiveQuota, Prechecks, billing_block_reason

P = "proj-x"
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def info(reason: str, domain: str = "googleapis.com") -> ErrorInfo:
    return ErrorInfo(reason=reason, domain=domain)


# (the refusal as the claimer records it: raw_error of code, message, ErrorInfo) -> kind, the reason people see
CASES = [
    pytest.param(raw_error(7, f"Billing account for project '{P}' is not found. Billing must be enabled for activation "
                              "of service(s) 'tpu.googleapis.com' to proceed.", info("BILLING_DISABLED")),
                 BlockKind.billing,
                 f"billing is disabled on project {P}: enable it, then run `tpuq fleet unblock` (or wait: tpuq "
                 "resumes by itself once Cloud Billing reports it enabled)", id="billing"),
    pytest.param(BILLING_OFF_MESSAGE, BlockKind.billing, billing_block_reason(P), id="billing-precheck"),
    pytest.param(raw_error(7, f"Permission 'tpu.queuedResources.create' denied on resource '//tpu.googleapis.com/"
                              f"projects/{P}/locations/us-central2-b' (or it may not exist).",
                           info("IAM_PERMISSION_DENIED", "tpu.googleapis.com")),
                 BlockKind.permission,
                 f"tpuq's claimer may not create TPUs in project {P}: grant tpuq-claimer@{P}.iam.gserviceaccount.com "
                 "roles/tpu.admin (`tpuq deploy` does), then run `tpuq fleet unblock`", id="permission"),
    pytest.param(raw_error(7, "The caller does not have permission"), BlockKind.permission, None,
                 id="permission-text-only"),
    pytest.param(raw_error(7, "Cloud TPU API has not been used in project 123 before or it is disabled. Enable it by "
                              "visiting https://console.developers.google.com/apis/api/tpu.googleapis.com/overview?"
                              "project=123 then retry.", info("SERVICE_DISABLED")),
                 BlockKind.api_disabled,
                 f"the Cloud TPU API is disabled on project {P}: run `gcloud services enable tpu.googleapis.com "
                 f"--project {P}`, then `tpuq fleet unblock`", id="api-disabled"),
    pytest.param(raw_error(7, "Permission denied: Consumer 'project:proj-x' has been suspended.",
                           info("CONSUMER_SUSPENDED")),
                 BlockKind.suspended,
                 f"project {P} is suspended: resolve it in the Google Cloud console, then run `tpuq fleet unblock`",
                 id="suspended"),
    pytest.param(raw_error(16, "Request had invalid authentication credentials."), BlockKind.permission, None,
                 id="unauthenticated"),
    pytest.param(raw_error(9, "Something new the project refuses"), BlockKind.other,
                 f"project {P} refuses new TPUs (`tpuq fleet --verbose` shows why): fix it, then run "
                 "`tpuq fleet unblock`", id="other"),
]


@pytest.mark.parametrize("raw, kind, reason", CASES)
def test_each_block_kind_reads_short_and_says_what_to_run(raw, kind, reason):
    assert block_kind(raw) is kind
    text = project_block_reason(P, raw)
    if reason is not None:
        assert text == reason
    assert "\n" not in text and len(text) < 200
    assert "`tpuq fleet unblock`" in text
    assert raw not in text  # the API's error stays behind --verbose / --json


def test_a_zone_without_quota_says_what_to_do():
    text = zone_quota_reason("us-central2-b", "v4-32", "spot")
    assert text == ("no spot quota for v4-32 in us-central2-b: raise it or take the zone out of the fleet file, then "
                    "run `tpuq fleet unblock` (or `tpuq fleet apply` the changed file)")


def fleet() -> FleetFile:
    return FleetFile.model_validate({"name": "f1", "project": P, "owner_prefix": "tq",
                                     "tpus": [{"id": "v4", "type": "v4-8", "zones": ["us-central2-b"], "count": 1}]})


def blocked_by(raw: str) -> FleetStatus:
    return FleetStatus(fleet="f1", blocked=project_block_reason(P, raw), blocked_version=fleet().version,
                       blocked_message=raw, blocked_at=NOW)


@pytest.mark.parametrize("raw, billing, clears", [
    (BILLING_OFF_MESSAGE, True, True),              # the pre-check found it off; now on
    (CASES[0].values[0], True, True),                # the TPU API refused for billing; Cloud Billing now says on
    (BILLING_OFF_MESSAGE, None, False),              # unreadable: nothing is known, the block stays
    (CASES[2].values[0], True, False),               # permission: billing says nothing about it
    (CASES[4].values[0], True, False),               # API disabled: likewise
])
def test_a_billing_block_clears_at_the_next_successful_billing_check(raw, billing, clears):
    state = ClaimState(fleet(), status=blocked_by(raw), prechecks=Prechecks(EffectiveQuota({}), BillingState(billing)))
    effects = decide_observed(state, Observed({}, plan=True), NOW, random.Random(1))
    if clears:
        assert effects.status is not None and not effects.status.is_blocked(fleet().version)
    else:
        assert effects.status is None


def test_while_blocked_the_claimer_reads_the_pre_checks_afresh():
    from tpuq.capacity.cloudchecks import PrecheckCache

    class Reader:
        reads = 0

        def read(self, fleet, now):
            Reader.reads += 1
            return Prechecks(EffectiveQuota({}), BillingState(True), read_at=now)

    cache = PrecheckCache(Reader(), ttl_seconds=300)
    cache.get(fleet(), NOW)
    cache.get(fleet(), NOW)
    assert Reader.reads == 1  # cached
    cache.get(fleet(), NOW, fresh=True)
    assert Reader.reads == 2
