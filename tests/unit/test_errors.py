"""google.api_core exceptions map once into the taxonomy that says what to do."""

import pytest
from google.api_core import exceptions as g

from tpuq.contracts import errors
from tpuq.contracts.errors import AlreadyExists, NotFound, Permanent, Retryable, from_api_error

QUOTA_TEXT = ("Quota limit 'TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI' has been exceeded. "
              "Limit: 0 in zone us-central2-b.")


@pytest.mark.parametrize("exc,expected", [
    (g.NotFound("queued resource x not found"), NotFound),
    (g.Conflict("already exists"), AlreadyExists),
    (g.AlreadyExists("already exists"), AlreadyExists),
    (g.ServiceUnavailable("backend unavailable"), Retryable),
    (g.DeadlineExceeded("deadline"), Retryable),
    (g.InternalServerError("oops"), Retryable),
    (g.TooManyRequests("Too many requests"), Retryable),
    (g.TooManyRequests("Quota exceeded for quota metric 'Requests' and limit 'Requests per minute'"), Retryable),
    (g.TooManyRequests(QUOTA_TEXT), Permanent),  # a zone's quota over REST: never retried blindly
    (g.ResourceExhausted('There is no more capacity in the zone "us-central2-b"'), Permanent),
    (g.PermissionDenied("Billing account for project 'p' is not found"), Permanent),
    (g.Forbidden("Billing account for project 'p' is not found"), Permanent),
    (g.BadRequest("DeleteQueuedResource is not supported when state is PROVISIONING"), Permanent),
    (ConnectionError("refused"), Retryable),
])
def test_mapping(exc, expected):
    assert type(from_api_error(exc)) is expected


def _info(reason):
    return {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com"}


_QUOTA_FAILURE = {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                  "violations": [{"subject": "project:1", "description": "Quota 'X' exhausted. Limit 4 in zone z"}]}


@pytest.mark.parametrize("details,error_info,expected", [
    # the TPU API's zone quota 429: a QuotaFailure, whatever the words say
    ([_QUOTA_FAILURE], None, Permanent),
    # Service Infrastructure's rate limit: retried, even when the words read like quota
    ([_info("RATE_LIMIT_EXCEEDED")], _info("RATE_LIMIT_EXCEEDED"), Retryable),
    ([], None, Retryable),  # nothing structured, nothing quota-like in the words: a rate limit
])
def test_a_429_is_told_apart_by_its_details_first(details, error_info, expected):
    exc = g.TooManyRequests("Request refused. Limit: 4 in zone z" if error_info else "Request refused.",
                            details=details, error_info=error_info)
    assert type(from_api_error(exc)) is expected


def test_the_taxonomy_holds_only_classes_something_raises_and_something_acts_on():
    """A class nobody raises (or nobody catches) is a promise the code does not keep: it must not exist."""
    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.TpuqError)}
    assert classes == {"TpuqError", "Retryable", "Permanent", "NotFound", "AlreadyExists"}
