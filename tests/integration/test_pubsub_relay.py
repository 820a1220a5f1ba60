"""The stack's Pub/Sub relay (tpuq_dev.devstack.pubsubrelay) makes delivery sooner and nothing else.

Each test runs a relay of its own against the session stack's emulator, in front of a recording endpoint that plays
the front, with a topic and push subscriptions of its own: what the relay pushed, what the emulator still pushes,
and what reaches the endpoint, counted per message.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import uuid

import pytest
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tpuq_dev.devstack import processes
from tpuq_dev.devstack.pubsubrelay import (PUSH_USER_AGENT, REST_PUBLISH, NotificationConfig, Running,
                                          published_topic)

from tests.helpers import wait_until


class Endpoint:
    """Plays the front: records each push (by message data), refuses the first `refuse_first` of each."""

    def __init__(self) -> None:
        self.port = processes.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.received: list[dict] = []
        self.agents: list[str] = []  # who pushed each received message: the relay says APIs-Google, as Pub/Sub does
        self.refusing = False
        self.refused = 0
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", self.port, self._app, threaded=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @Request.application
    def _app(self, request: Request) -> Response:
        envelope = json.loads(request.get_data())
        with self._lock:
            if self.refusing:
                self.refused += 1
                return Response(status=503)
            self.received.append(envelope)
            self.agents.append(request.headers.get("User-Agent", ""))
        return Response(status=204)

    def datas(self) -> list[str]:
        with self._lock:
            return sorted(base64.b64decode(e["message"]["data"]).decode() for e in self.received)

    def stop(self) -> None:
        self._server.shutdown()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.stop()


@pytest.fixture
def relay(stack, endpoint, monkeypatch):
    grpc_port, mux_port = processes.free_port(), processes.free_port()
    running = Running(stack.pubsub_emulator_host, grpc_port, [endpoint.url], mux_port)
    running.grpc_host, running.mux_host = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{mux_port}"
    running.kicked = []  # the topics whose publishes started the relay's pulls
    kick_all = running.relay._kick_all
    monkeypatch.setattr(running.relay, "_kick_all", lambda topic: (running.kicked.append(topic), kick_all(topic)))
    yield running
    running.stop()


@pytest.fixture
def topic(stack):
    name = f"projects/{stack.project}/topics/relay-{uuid.uuid4().hex[:8]}"
    base = f"http://{stack.pubsub_emulator_host}/v1/"
    requests.put(base + name, timeout=10).raise_for_status()
    yield name
    requests.delete(base + name, timeout=10)


def subscribe(stack, topic: str, push_endpoint: str) -> str:
    name = f"projects/{stack.project}/subscriptions/relay-{uuid.uuid4().hex[:8]}"
    requests.put(f"http://{stack.pubsub_emulator_host}/v1/{name}", timeout=10,
                 json={"topic": topic, "pushConfig": {"pushEndpoint": push_endpoint}}).raise_for_status()
    return name


def publish_grpc(host: str, topic: str, datas: list[str], monkeypatch) -> None:
    from google.cloud import pubsub_v1

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
    publisher = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=1))
    for future in [publisher.publish(topic, d.encode(), origin="test") for d in datas]:
        future.result(timeout=30)


def test_published_through_the_relay_each_message_is_pushed_once(stack, relay, endpoint, topic, monkeypatch):
    """Fails if the relay drops, alters or doubles a message, or leaves all the pushing to the emulator."""
    subscription = subscribe(stack, topic, endpoint.url + "/push/here")
    datas = [f"m{i}" for i in range(40)]
    publish_grpc(relay.grpc_host, topic, datas, monkeypatch)
    # The emulator's push loop still runs (every 100 ms): a message it reached first is its push.
    wait_until(lambda: len(endpoint.received) >= len(datas), timeout=30, what="every message pushed")
    assert relay.kicked == [topic] * len(datas)
    wait_until(lambda: relay.relay.pushed == endpoint.agents.count(PUSH_USER_AGENT), timeout=10,
               what="the relay's acknowledgements")
    extra = 0
    while relay.relay.pushed == 0 and extra < 50:  # a loaded machine: the emulator won every race so far
        extra += 1
        publish_grpc(relay.grpc_host, topic, [f"extra{extra}"], monkeypatch)
        wait_until(lambda: len(endpoint.received) >= len(datas) + extra, timeout=30, what="the extra message")
    assert relay.relay.pushed > 0
    assert endpoint.datas() == sorted([*datas, *(f"extra{i}" for i in range(1, extra + 1))])  # each once
    first = endpoint.received[endpoint.agents.index(PUSH_USER_AGENT)]
    assert first["subscription"] == subscription
    assert set(first["message"]) >= {"data", "messageId", "publishTime", "attributes"}
    assert first["message"]["attributes"] == {"origin": "test"}
    # Acknowledged: nothing left for the emulator to push again.
    left = requests.post(f"http://{stack.pubsub_emulator_host}/v1/{subscription}:pull", timeout=10,
                         json={"returnImmediately": True, "maxMessages": 10}).json()
    assert left.get("receivedMessages", []) == []


def test_a_push_the_front_refuses_goes_back_to_the_emulator_and_is_delivered(stack, relay, endpoint, topic):
    """Fails if the relay acknowledges a push that was not taken (the message would be lost)."""
    endpoint.refusing = True
    subscription = subscribe(stack, topic, endpoint.url + "/push")
    body = {"messages": [{"data": base64.b64encode(b"refused-first").decode()}]}
    requests.post(f"http://{stack.pubsub_emulator_host}/v1/{topic}:publish", json=body, timeout=10).raise_for_status()
    # The relay's own drain, called here so that it surely handles the message (the emulator's push of it, refused
    # too, may hold it for a moment): pulled, pushed, refused, handed back.
    wait_until(lambda: relay.relay._pull_and_push(subscription, endpoint.url + "/push") == 1, timeout=30,
               what="the relay to pull the message")
    assert relay.relay.pushed == 0
    endpoint.refusing = False
    wait_until(lambda: endpoint.datas() == ["refused-first"], timeout=30, what="the emulator's delivery after refusals")
    assert endpoint.agents != [PUSH_USER_AGENT]


def test_a_subscription_pushing_elsewhere_is_left_to_the_emulator(stack, relay, endpoint, topic, monkeypatch):
    other = Endpoint()
    try:
        subscribe(stack, topic, other.url + "/elsewhere")  # not one of the relay's front URLs
        publish_grpc(relay.grpc_host, topic, ["for-elsewhere"], monkeypatch)
        wait_until(lambda: other.datas() == ["for-elsewhere"], timeout=30, what="the emulator's push")
        assert relay.kicked == [topic] and relay.relay.pushed == 0 and endpoint.received == []
    finally:
        other.stop()


def test_everyone_s_port_passes_rest_to_the_emulator_and_a_rest_publish_is_pushed_by_the_relay(stack, relay, endpoint,
                                                                                              topic):
    subscription = subscribe(stack, topic, endpoint.url + "/push")
    direct = requests.get(f"http://{stack.pubsub_emulator_host}/v1/{subscription}", timeout=10)
    through = requests.get(f"http://{relay.mux_host}/v1/{subscription}", timeout=10)
    assert (through.status_code, through.json()) == (direct.status_code, direct.json())
    missing = requests.get(f"http://{relay.mux_host}/v1/{subscription}-missing", timeout=10)
    assert missing.status_code == 404  # the emulator's refusal, unchanged
    body = {"messages": [{"data": base64.b64encode(b"by-rest").decode()}]}
    answer = requests.post(f"http://{relay.mux_host}/v1/{topic}:publish", json=body, timeout=10)
    assert answer.status_code == 200 and answer.json()["messageIds"]
    wait_until(lambda: endpoint.datas() == ["by-rest"], timeout=30, what="the REST publish pushed")
    assert relay.kicked == [topic]  # seen on the way back from the emulator
    wait_until(lambda: relay.relay.pushed == endpoint.agents.count(PUSH_USER_AGENT), timeout=10,
               what="the relay's acknowledgement")  # 1 unless the emulator's push loop came first


def test_the_stack_s_services_publish_through_its_relay(stack):
    """The services' processes are given the relay's gRPC port; people get the port for both protocols."""
    assert stack.pubsub_relay_host and stack.env["PUBSUB_EMULATOR_HOST"] != stack.pubsub_emulator_host
    for rec in stack.records:
        if rec.name in stack.services:
            environ = open(f"/proc/{rec.pid}/environ", "rb").read().split(b"\0")
            assert f"PUBSUB_EMULATOR_HOST={stack.pubsub_relay_host}".encode() in environ, rec.name


def test_what_the_relay_reads_off_the_wire():
    from google.pubsub_v1.types import PublishRequest

    raw = PublishRequest.serialize(PublishRequest(topic="projects/p/topics/jobs", messages=[{"data": b"x"}]))
    assert published_topic(raw) == "projects/p/topics/jobs"
    line = b"POST /v1/projects/tpuq-local/topics/jobs:publish?alt=json HTTP/1.1\r\nHost: x\r\n\r\n{}"
    assert [m.group(1) for m in REST_PUBLISH.finditer(line)] == [b"projects/tpuq-local/topics/jobs"]
    assert not REST_PUBLISH.search(b"POST /v1/projects/p/subscriptions/s:pull HTTP/1.1\r\n")


def test_a_publish_as_large_as_pub_sub_takes_passes_the_relay(stack, relay, endpoint, topic, monkeypatch):
    """gRPC's own 4 MB limit must not refuse what Pub/Sub accepts (a publish request up to 10 MB)."""
    subscribe(stack, topic, endpoint.url + "/push")
    publish_grpc(relay.grpc_host, topic, ["x" * (6 << 20)], monkeypatch)
    wait_until(lambda: len(endpoint.received) == 1, timeout=60, what="the 6 MB message pushed")


def _object_event(bucket: str, name: str) -> dict:
    """A finalize notification's attributes as Cloud Storage (and fake-gcs-server) set them."""
    return {"eventType": "OBJECT_FINALIZE", "bucketId": bucket, "objectId": name, "payloadFormat": "JSON_API_V1"}


def test_object_notifications_no_config_covers_are_not_published(stack, endpoint, topic, monkeypatch):
    """Cloud Storage publishes an object's notification only if one of the bucket's configs covers it (bucket,
    prefix, event type); fake-gcs-server publishes every object. Fails if the relay passes the others on."""
    from google.cloud import pubsub_v1

    grpc_port = processes.free_port()
    configs = [NotificationConfig(topic.rsplit("/", 1)[1], "runner", "tpuq/status/"),
               NotificationConfig(topic.rsplit("/", 1)[1], "runner", "submit/")]
    running = Running(stack.pubsub_emulator_host, grpc_port, [endpoint.url], notifications=configs)
    try:
        subscribe(stack, topic, endpoint.url + "/push")
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{grpc_port}")
        # One request with all five (the Go client fake-gcs-server uses batches too): the answer still has an id
        # for each, in order, and only the covered ones and the test's own message reach the subscription.
        publisher = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=5,
                                                                                            max_latency=5.0))
        sent = [("log", _object_event("runner", "tpuq/jobs/j/attempts/1/tpuq-logs/worker-0/000000.txt")),
                ("status", _object_event("runner", "tpuq/status/j/1/worker-0.json")),
                ("other-bucket", _object_event("job-bucket", "tpuq/status/j/1/worker-0.json")),
                ("submitted", _object_event("runner", "submit/train.yaml")),
                ("own", {"origin": "test"})]
        futures = [publisher.publish(topic, data.encode(), **attributes) for data, attributes in sent]
        ids = [f.result(timeout=30) for f in futures]
        assert len(set(ids)) == 5 and all(ids)
        wait_until(lambda: len(endpoint.received) >= 3, timeout=30, what="the covered messages pushed")
        assert running.notifications.not_published == 2
        # Only uncovered messages in a request: nothing reaches the emulator, the publisher still gets its id.
        alone = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=1))
        assert alone.publish(topic, b"checkpoint", **_object_event("runner", "tpuq/jobs/j/checkpoints/ck")).result(
            timeout=30)
        assert running.notifications.not_published == 3
        alone.publish(topic, b"last", origin="test").result(timeout=30)
        wait_until(lambda: "last" in endpoint.datas(), timeout=30, what="a later message")
        assert endpoint.datas() == ["last", "own", "status", "submitted"]
    finally:
        running.stop()


class GcsEvents:
    """The stack's runner bucket, and a pull subscription of this test's own on gcs-events to see what reached it."""

    def __init__(self, stack, monkeypatch):
        from google.cloud import pubsub_v1, storage

        self.host = stack.pubsub_emulator_host
        self.name = f"projects/{stack.project}/subscriptions/gcs-watch-{uuid.uuid4().hex[:8]}"
        requests.put(f"http://{self.host}/v1/{self.name}", timeout=10,
                     json={"topic": f"projects/{stack.project}/topics/gcs-events"}).raise_for_status()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", stack.env["STORAGE_EMULATOR_HOST"])
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", self.host)
        self.bucket = storage.Client(project=stack.project).bucket(stack.runner_bucket)
        self._subscriber = pubsub_v1.SubscriberClient()
        self.seen: dict[str, str] = {}  # objectId -> message id, in the order pulled

    def pulled(self) -> set[str]:
        """The objects whose notifications reached gcs-events so far."""
        answer = self._subscriber.pull(subscription=self.name, max_messages=10, return_immediately=True, timeout=10)
        self.seen.update({m.message.attributes["objectId"]: m.message.message_id for m in answer.received_messages})
        return set(self.seen)

    def close(self) -> None:
        requests.delete(f"http://{self.host}/v1/{self.name}", timeout=10)


@pytest.fixture
def gcs_events(stack, monkeypatch):
    watcher = GcsEvents(stack, monkeypatch)
    yield watcher
    watcher.close()


def test_the_stack_publishes_only_the_object_notifications_its_bucket_configs_cover(stack, gcs_events):
    """The stack's relay has infra/storage.yaml's configs: a log chunk stored in the runner bucket never reaches
    gcs-events, a status object does. Fails if the stack leaves fake-gcs-server's every object to the topic."""
    assert [(c["prefix"], c["bucket"]) for c in stack.notification_configs()] == [
        ("submit/", stack.runner_bucket), ("tpuq/status/", stack.runner_bucket)]
    job = f"relay-{uuid.uuid4().hex[:6]}"
    gcs_events.bucket.blob(f"tpuq/jobs/{job}/attempts/1/tpuq-logs/worker-0/000000.txt").upload_from_string("a log\n")
    gcs_events.bucket.blob(f"tpuq/jobs/{job}/checkpoints/step-1").upload_from_string("weights")
    status = f"tpuq/status/{job}/1/worker-0.json"
    gcs_events.bucket.blob(status).upload_from_string("{}")  # no such attempt: ignored
    wait_until(lambda: status in gcs_events.pulled(), timeout=30, what="the status object's notification")
    assert gcs_events.pulled() == {status}


def test_each_service_is_pushed_only_the_objects_its_subscription_s_filter_selects(stack, gcs_events):
    """Both of the runner bucket's notification configs publish to gcs-events; each subscription's filter
    (topology: a prefix of `objectId`) takes its own objects. The emulator stores filters but delivers everything:
    fails if the front leaves that to the services (the scheduler pushed every status object, the executor every
    job file), as production never would."""
    tag = uuid.uuid4().hex[:6]
    status, submitted = f"tpuq/status/filter-{tag}/1/worker-0.json", f"submit/filter-{tag}/notes.txt"
    gcs_events.bucket.blob(status).upload_from_string("{}")  # no such attempt: the executor ignores it
    gcs_events.bucket.blob(submitted).upload_from_string("not a job file")  # not .yaml or .json: ignored
    wait_until(lambda: {status, submitted} <= gcs_events.pulled(), timeout=30, what="both objects' notifications")
    ids = gcs_events.seen

    def seen() -> dict[str, set[tuple[str, bool]]]:
        out: dict[str, set[tuple[str, bool]]] = {ids[status]: set(), ids[submitted]: set()}
        for line in stack.delivery_log_file.read_text().splitlines():
            entry = json.loads(line)
            if entry["message_id"] in out:
                out[entry["message_id"]].add((entry["subscription"].rsplit("/", 1)[-1], bool(entry.get("filtered"))))
        return out

    wait_until(lambda: all(len(v) == 2 for v in seen().values()), timeout=60,
               what="each notification pushed to one subscription and left out of the other")
    assert seen() == {ids[status]: {("executor-gcs-status", False), ("scheduler-gcs-submit", True)},
                      ids[submitted]: {("scheduler-gcs-submit", False), ("executor-gcs-status", True)}}


def test_everyone_s_port_keeps_accepting_after_a_connection_it_could_not_serve(monkeypatch):
    """A failure to serve one connection (here: no thread to spare) must not end the port's accept loop: later
    clients would connect to a backlog nobody serves and hang until their deadlines."""
    from tpuq_dev.devstack import pubsubrelay

    routed: list = []
    starts = {"n": 0}
    real_thread = threading.Thread

    class FlakyThread(real_thread):
        def start(self):
            starts["n"] += 1
            if starts["n"] == 1:
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(pubsubrelay.threading, "Thread", FlakyThread)
    monkeypatch.setattr(pubsubrelay, "_route", lambda client, *_: (routed.append(client), client.close()))
    listener = socket.create_server(("127.0.0.1", 0))
    loop = real_thread(target=pubsubrelay._accept, args=(listener, ("127.0.0.1", 1), ("127.0.0.1", 1), print),
                       daemon=True)
    loop.start()
    try:
        for _ in range(2):
            socket.create_connection(listener.getsockname(), timeout=5).close()
        wait_until(lambda: len(routed) == 1, timeout=10, what="the second connection served")
    finally:
        listener.close()
