"""What tpuq relies on Pub/Sub's publisher to do, on the in-memory stub and on the emulator of the session stack."""

from __future__ import annotations

import uuid

import pytest
from google.api_core.exceptions import NotFound

from tpuq.runtime.clients import Clients

from tpuq.runtime.settings import Settings
from tpuq_dev.inmemory import MemoryPublisher


@pytest.fixture(params=["memory", "emulator"])
def publisher_and_topic(request):
    """A publisher and a topic of this test's own (no service subscribes to it)."""
    if request.param == "memory":
        topic = f"projects/tpuq-local/topics/contract-{uuid.uuid4().hex[:12]}"
        yield MemoryPublisher([topic]), topic
        return
    stack = request.getfixturevalue("stack")
    publisher = Clients(Settings.from_env(stack.env)).publisher
    topic = f"projects/{stack.project}/topics/contract-{uuid.uuid4().hex[:12]}"
    publisher.create_topic(name=topic)
    yield publisher, topic
    publisher.delete_topic(topic=topic)


def test_publish_returns_a_distinct_message_id(publisher_and_topic):
    publisher, topic = publisher_and_topic
    ids = {publisher.publish(topic, b"{}", source="cli").result(timeout=30) for _ in range(3)}
    assert len(ids) == 3 and all(isinstance(i, str) and i for i in ids)


def test_publish_refuses_text_data_and_non_text_attributes(publisher_and_topic):
    publisher, topic = publisher_and_topic
    with pytest.raises(TypeError):
        publisher.publish(topic, "{}")
    with pytest.raises(TypeError):
        publisher.publish(topic, b"{}", attempt=1)


def test_publish_to_an_undeclared_topic_fails(publisher_and_topic):
    publisher, topic = publisher_and_topic
    with pytest.raises(NotFound):
        publisher.publish(topic + "-missing", b"{}").result(timeout=30)
