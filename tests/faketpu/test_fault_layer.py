"""The fake's chaos weather (faults.py): seeded 503s, timeouts and latency spikes on REST calls, seen through the
real tpu_v2 client, and mapped by tpuq's error taxonomy as retryable."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from tpuq.contracts.errors import Retryable, from_api_error
from tpuq_dev.faketpu.control import FakeTpuControl, FakeTpuControlError

from .conftest import FAST_SCENARIO, manual_clock_server, qr_request, tpu_client

ZONE = next(iter(FAST_SCENARIO["zones"]))


@pytest.fixture
def server(tmp_path):
    server, _clock = manual_clock_server(tmp_path)
    server.start()
    yield server
    server.stop()


def test_unavailable_is_googles_503_body_and_tpuq_retries_it(server, project):
    control = FakeTpuControl(server.url)
    control.set_chaos(1, unavailable=1.0)
    client = tpu_client(server.url)
    with pytest.raises(gexc.ServiceUnavailable) as raised:
        client.get_queued_resource(name=f"projects/{project}/locations/{ZONE}/queuedResources/q1")
    assert raised.value.message.endswith(": The service is currently unavailable.")
    assert isinstance(from_api_error(raised.value), Retryable)
    assert control.health()["ok"]  # control calls never get weather
    assert control.chaos()["injected"] == {"unavailable": 1}
    assert control.calls()[-1]["status"] == 503  # the log keeps what the client was answered


def test_a_timeout_may_lose_only_the_answer_and_the_create_still_happened(server, project):
    control = FakeTpuControl(server.url)
    control.set_chaos(3, timeout=1.0, hang_seconds=0.05)
    client = tpu_client(server.url)
    for i in range(8):
        with pytest.raises(gexc.GatewayTimeout) as raised:
            client.create_queued_resource(request=qr_request(project, ZONE, f"q{i}", f"n{i}"))
        assert isinstance(from_api_error(raised.value), Retryable)
    control.set_chaos(0)
    found = {q.name.rsplit("/", 1)[-1] for q in client.list_queued_resources(
        parent=f"projects/{project}/locations/{ZONE}")}
    # Seed 3 does some of the creates before the hang and refuses the others: both kinds of timeout happen.
    assert 0 < len(found) < 8, found
    assert {c["status"] for c in control.calls(method="POST")} == {504}


def test_the_same_seed_gives_the_same_weather(server, project):
    control = FakeTpuControl(server.url)
    client = tpu_client(server.url)
    name = f"projects/{project}/locations/{ZONE}/queuedResources/none"

    def weather() -> list[str]:
        control.set_chaos(11, unavailable=0.3, spike=0.3, spike_max_seconds=0.01)
        out = []
        for _ in range(20):
            try:
                client.get_queued_resource(name=name)
            except gexc.GoogleAPICallError as e:
                out.append(type(e).__name__)
        return out

    first = weather()
    assert "ServiceUnavailable" in first and "NotFound" in first
    assert weather() == first


@pytest.mark.parametrize("body", [{"unavailable": 2}, {"unavailable": 0.6, "timeout": 0.6}, {"rain": 1},
                                  {"spike": "much"}])
def test_bad_weather_is_refused(server, body):
    control = FakeTpuControl(server.url)
    with pytest.raises(FakeTpuControlError, match="400"):
        control._call("POST", "chaos", json=body)
