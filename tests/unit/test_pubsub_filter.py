"""The local front's Pub/Sub subscription filters (tpuq_dev.pubsubfilter): the language as
https://cloud.google.com/pubsub/docs/subscription-message-filter states it, and what Pub/Sub refuses."""

from __future__ import annotations

import pytest

from tpuq.contracts import topology
from tpuq_dev.pubsubfilter import MAX_FILTER_BYTES, FilterError, compile_filter

STATUS = {"objectId": "tpuq/status/j/1/worker-0.json", "eventType": "OBJECT_FINALIZE", "bucketId": "b"}
SUBMIT = {"objectId": "submit/run.yaml", "eventType": "OBJECT_FINALIZE", "bucketId": "b"}


@pytest.mark.parametrize("text, status, submit", [
    ("", True, True),
    ('hasPrefix(attributes.objectId, "tpuq/status/")', True, False),
    ('attributes.objectId = "submit/run.yaml"', False, True),
    ('attributes.objectId != "submit/run.yaml"', True, False),
    ("attributes:objectId", True, True),
    ("attributes:missing", False, False),
    ('NOT hasPrefix(attributes.objectId, "submit/")', True, False),
    ('-hasPrefix(attributes.objectId, "submit/")', True, False),
    ('attributes.eventType = "OBJECT_FINALIZE" AND hasPrefix(attributes.objectId, "submit/")', False, True),
    ('hasPrefix(attributes.objectId, "submit/") OR hasPrefix(attributes.objectId, "tpuq/")', True, True),
    ('(attributes:bucketId OR attributes:x) AND NOT attributes.objectId = "submit/run.yaml"', True, False),
    ('attributes."objectId" = "submit/run.yaml"', False, True),
    ('hasPrefix(attributes.objectId, "SUBMIT/")', False, False),  # case-sensitive
])
def test_a_filter_selects_by_attributes_as_pubsub_does(text, status, submit):
    matches = compile_filter(text)
    assert (matches(STATUS), matches(SUBMIT)) == (status, submit)


@pytest.mark.parametrize("text", [
    "this is (not a filter",  # the emulator stores this one as it is
    'attributes.objectId = submit',  # a value is a string literal
    'hasPrefix(attributes.objectId)',
    'attributes:a AND attributes:b OR attributes:c',  # AND with OR: parentheses
    'data = "x"',  # only attributes can be filtered on
    '(attributes:a',
    'attributes:a attributes:b',
    'x' * (MAX_FILTER_BYTES + 1),
])
def test_a_filter_pubsub_would_refuse_is_refused(text):
    with pytest.raises(FilterError):
        compile_filter(text)


def test_every_declared_subscription_filter_is_valid_and_selects_only_its_own_objects():
    filters = {s.name: s.filter for s in topology.SUBSCRIPTIONS if s.filter}
    assert set(filters) == {"scheduler-gcs-submit", "executor-gcs-status"}
    submit, status = (compile_filter(filters[n]) for n in ("scheduler-gcs-submit", "executor-gcs-status"))
    assert submit(SUBMIT) and not submit(STATUS)
    assert status(STATUS) and not status(SUBMIT)


def test_the_local_stack_refuses_to_create_a_subscription_with_a_filter_pubsub_refuses():
    """The emulator would store it; Pub/Sub answers 400 INVALID_ARGUMENT. Refused before any request is made (port 9
    answers nothing)."""
    from tpuq.operations.stackenv import StackError
    from tpuq_dev.devstack.stack import put_subscription

    with pytest.raises(StackError, match="INVALID_ARGUMENT: filter"):
        put_subscription("http://127.0.0.1:9/v1/projects/p", "s", {"topic": "projects/p/topics/t",
                                                                    "filter": "this is (not a filter"})
