"""The local stack's services publish through this relay, so their messages reach the front without the emulator's wait.

Why: the Pub/Sub emulator's push loop looks for new messages every 100 ms per subscription (its `PushLoop`,
`checkIntervalMillis` 100, read from the emulator's jar), so every hop of an event waited 50 ms on average and up
to 100 ms before the front's dispatcher (tpuq_dev.devstack.dispatcher) even saw it: on a job's path from publish to
running (two hops) and from one job's end to the next one's start (three), that wait was most of the local
latency, and none of it is Pub/Sub's (Pub/Sub pushes a message as soon as its push window allows; Google publishes
no figure for the delay, so the stand-in adds none).

What it does: a gRPC server the services use as `PUBSUB_EMULATOR_HOST` (and fake-gcs-server for its object
notifications). Every call goes through to the emulator unchanged, byte for byte (the emulator still answers,
refuses and stores everything). After a `Publish` the emulator accepted, the relay pulls the topic's push
subscriptions whose endpoint is one of the front's URLs (`Pull` with `returnImmediately`) and pushes each message
there exactly as the emulator's push loop would (the same envelope, no token: the front takes it at once with 204,
and its dispatcher delivers it with Pub/Sub's rules), then acknowledges it. What the relay does not deliver (a
push the front refused, a publish made straight to the emulator by a person or a test) stays with the emulator,
whose push loop delivers it as before: the relay only makes delivery sooner, it never drops or alters a message
(but for the object notifications Cloud Storage would not send, below).

Cloud Storage's notification configs: fake-gcs-server publishes every object it stores (one bucket and one prefix
at most, by its flags), where Cloud Storage publishes only what a notification config of the bucket covers (its
bucket, `object_name_prefix` and event types: infra/storage.yaml has two on the runner bucket, `submit/` and
`tpuq/status/`). Given those configs (`--notifications`), the relay publishes on their topics only the object
notifications some config covers, as Cloud Storage would, and answers fake-gcs-server for the rest as if
published: log chunks, checkpoints and bundles never reach the scheduler and the executor, locally as in
production (before, 3 of the 4 pushes an ordinary job's objects caused were ones production never sends). A
message with no `eventType` attribute is not an object notification (a test's own publish) and passes unchanged.

People and tests get the relay's second port as `PUBSUB_EMULATOR_HOST` (`tpuq dev env`): a connection that opens
with HTTP/2's preface (a gRPC client: the Python and Go libraries) goes to the relay; any other (HTTP/1.1: gcloud
and REST calls, which the emulator also answers on its one port) goes to the emulator byte for byte, and a REST
publish seen on it starts the same pulls once its answer comes back.

Run: `python -m tpuq_dev.devstack.pubsubrelay --pubsub HOST:PORT --port PORT --mux-port PORT --front-url URL ...`
(the stack does).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from concurrent import futures

import grpc
import requests
from google.protobuf import json_format

log = logging.getLogger("tpuq_dev.devstack.pubsubrelay")

PUBLISH = "/google.pubsub.v1.Publisher/Publish"
STREAMING = {"/google.pubsub.v1.Subscriber/StreamingPull"}  # the API's one streaming method (bidirectional)
PULL_BATCH = 100
# gRPC's 4 MB default would refuse a publish Pub/Sub takes (a request up to 10 MB): the emulator decides instead.
MESSAGE_SIZE_OPTIONS = [("grpc.max_receive_message_length", 32 << 20), ("grpc.max_send_message_length", 32 << 20)]
TOPIC_SUBSCRIPTIONS_TTL_SECONDS = 2.0  # a subscription created since is pushed by the emulator meanwhile
PUSH_TIMEOUT_SECONDS = 10.0
HTTP2_PREFACE_START = b"PRI "  # "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": a gRPC connection's first bytes
REST_PUBLISH = re.compile(rb"POST /v1/(projects/[^/\s]+/topics/[^/:\s?]+):publish[\s?]")
# Pub/Sub's pushes come from Google's push agent (https://developers.google.com/webmasters/APIs-Google.html); the
# emulator's say Java/<version>.
PUSH_USER_AGENT = "APIs-Google; (+https://developers.google.com/webmasters/APIs-Google.html)"
PUSHERS = 8  # a pulled batch's messages pushed to the front together (the front takes each at once)


def published_topic(request: bytes) -> str:
    """The topic of a serialized PublishRequest (field 1)."""
    from google.pubsub_v1.types import PublishRequest

    return PublishRequest.pb().FromString(request).topic


@dataclass(frozen=True)
class NotificationConfig:
    """A bucket's notification config as Cloud Storage applies it: the objects of `bucket` whose names start with
    `prefix`, for the `event_types` named, are published to `topic` (short name)."""

    topic: str
    bucket: str
    prefix: str
    event_types: tuple[str, ...] = ("OBJECT_FINALIZE",)

    def covers(self, attributes) -> bool:
        return (attributes.get("bucketId") == self.bucket and attributes.get("objectId", "").startswith(self.prefix)
                and attributes.get("eventType") in self.event_types)


class Notifications:
    """Every notification config of the stack's buckets, by topic."""

    def __init__(self, configs: list[NotificationConfig]):
        self._by_topic: dict[str, list[NotificationConfig]] = {}
        for config in configs:
            self._by_topic.setdefault(config.topic, []).append(config)
        self.not_published = 0

    def filtered(self, request: bytes, topic: str) -> tuple[bytes | None, list[bool]]:
        """(the request to `topic` with only the messages Cloud Storage would publish, or None: none; which were
        kept), or (`request` itself, []) when nothing is left out. Parsed whole only for a topic with configs."""
        configs = self._by_topic.get(topic.rsplit("/", 1)[-1])
        if not configs:
            return request, []
        from google.pubsub_v1.types import PublishRequest

        parsed = PublishRequest.pb().FromString(request)
        kept = [not m.attributes.get("eventType") or any(c.covers(m.attributes) for c in configs)
                for m in parsed.messages]
        if all(kept):
            return request, []
        self.not_published += kept.count(False)
        if not any(kept):
            return None, kept
        messages = [m for m, keep in zip(parsed.messages, kept) if keep]
        del parsed.messages[:]
        parsed.messages.extend(messages)
        return parsed.SerializeToString(), kept


def _answer_with_left_out(answer: bytes | None, kept: list[bool]) -> bytes:
    """The PublishResponse for the whole request: the emulator's message ids for the messages it got, a made-up
    one (never delivered) for each one left out, in the request's order."""
    from google.pubsub_v1.types import PublishResponse

    given = iter(PublishResponse.pb().FromString(answer).message_ids if answer is not None else [])
    ids = [next(given) if keep else f"not-published-{uuid.uuid4().hex[:12]}" for keep in kept]
    return PublishResponse.pb()(message_ids=ids).SerializeToString()


class _Forwarder(grpc.GenericRpcHandler):
    """Every method passed through to the emulator as raw bytes; `published(topic)` after each accepted Publish."""

    def __init__(self, channel: grpc.Channel, published: Callable[[str], None],
                 notifications: Notifications | None = None):
        self._channel = channel
        self._published = published
        self._notifications = notifications or Notifications([])

    def service(self, handler_call_details):
        method = handler_call_details.method
        if method in STREAMING:
            upstream_stream = self._channel.stream_stream(method)

            def stream(requests_in, context):
                call = upstream_stream(requests_in, timeout=context.time_remaining())
                context.add_callback(call.cancel)
                try:
                    yield from call
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        context.abort(e.code(), e.details() or "")

            return grpc.stream_stream_rpc_method_handler(stream)
        upstream = self._channel.unary_unary(method)

        def unary(request: bytes, context):
            kept: list[bool] = []
            if method == PUBLISH:
                topic = published_topic(request)
                request, kept = self._notifications.filtered(request, topic)
                if request is None:  # only object notifications no config covers: Cloud Storage sends none
                    return _answer_with_left_out(None, kept)
            try:
                answer = upstream(request, timeout=context.time_remaining())
            except grpc.RpcError as e:
                context.abort(e.code(), e.details() or "")
            if method == PUBLISH:
                self._published(topic)
                if kept:
                    return _answer_with_left_out(answer, kept)
            return answer

        return grpc.unary_unary_rpc_method_handler(unary)


class Relay:
    """Pulls a topic's front-bound push subscriptions after each publish and pushes what it pulled to the front."""

    def __init__(self, channel: grpc.Channel, front_urls: list[str], clock: Callable[[], float] = time.monotonic):
        self._emulator = _Emulator(channel)
        self._front_urls = tuple(u.rstrip("/") + "/" for u in front_urls)
        self._clock = clock
        self._session = requests.Session()
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=64))
        self._lock = threading.Lock()
        self._targets: dict[str, tuple[list[tuple[str, str]], float]] = {}  # topic -> [(subscription, endpoint)]
        self._pushers = futures.ThreadPoolExecutor(max_workers=PUSHERS, thread_name_prefix="relay-push")
        self._refreshing: set[str] = set()  # topics whose subscriptions are being read again
        self._draining: set[str] = set()
        self._again: set[str] = set()
        self.pushed = 0

    def published(self, topic: str) -> None:
        """Called on the Publish call's thread: the pulls start on threads of their own, the answer goes at once."""
        threading.Thread(target=self._kick_all, args=(topic,), daemon=True).start()

    def _kick_all(self, topic: str) -> None:
        for subscription, endpoint in self._push_targets(topic):
            self._kick(subscription, endpoint)

    def _push_targets(self, topic: str) -> list[tuple[str, str]]:
        """The topic's subscriptions that push to the front. Read once, then kept: an answer older than
        `TOPIC_SUBSCRIPTIONS_TTL_SECONDS` is still used while a read in the background replaces it, so that no
        publish waits for the emulator's answers (tens of milliseconds on a loaded machine)."""
        with self._lock:
            cached = self._targets.get(topic)
            stale = cached is None or self._clock() - cached[1] >= TOPIC_SUBSCRIPTIONS_TTL_SECONDS
            refresh = stale and cached is not None and topic not in self._refreshing
            if refresh:
                self._refreshing.add(topic)
        if cached is None:
            return self._read_targets(topic)
        if refresh:
            threading.Thread(target=self._read_targets, args=(topic,), daemon=True).start()
        return cached[0]

    def _read_targets(self, topic: str) -> list[tuple[str, str]]:
        targets = []
        try:
            for name in self._emulator.subscriptions_of(topic):
                endpoint = self._emulator.push_endpoint(name)
                if endpoint.startswith(self._front_urls):
                    targets.append((name, endpoint))
        except grpc.RpcError as e:
            log.warning("%s: subscriptions not read (%s): the emulator pushes its messages", topic, e.code())
            with self._lock:
                self._refreshing.discard(topic)
            return []
        with self._lock:
            self._targets[topic] = (targets, self._clock())
            self._refreshing.discard(topic)
        return targets

    def _kick(self, subscription: str, endpoint: str) -> None:
        """One drain of the subscription at a time; a publish during it drains again after it."""
        with self._lock:
            if subscription in self._draining:
                self._again.add(subscription)
                return
            self._draining.add(subscription)
        threading.Thread(target=self._drain, args=(subscription, endpoint), daemon=True).start()

    def _drain(self, subscription: str, endpoint: str) -> None:
        while True:
            try:
                full = self._pull_and_push(subscription, endpoint) == PULL_BATCH
            except grpc.RpcError as e:
                log.warning("%s: relay pull failed (%s): the emulator pushes its messages", subscription, e.code())
                with self._lock:
                    self._targets.clear()  # gone or changed (a reset): read the subscriptions again next time
                full = False
            with self._lock:
                if not full and subscription not in self._again:
                    self._draining.discard(subscription)
                    return
                self._again.discard(subscription)

    def _pull_and_push(self, subscription: str, endpoint: str) -> int:
        received = self._emulator.pull(subscription, PULL_BATCH)

        def push(item) -> str | None:
            envelope = {"message": json_format.MessageToDict(item.message), "subscription": subscription}
            try:
                status = self._session.post(endpoint, json=envelope, headers={"User-Agent": PUSH_USER_AGENT},
                                            timeout=PUSH_TIMEOUT_SECONDS).status_code
            except requests.RequestException:
                status = 0
            return item.ack_id if 200 <= status < 300 else None

        answers = list(self._pushers.map(push, received) if len(received) > 1 else map(push, received))
        delivered = [ack for ack in answers if ack]
        refused = [item.ack_id for item, ack in zip(received, answers) if not ack]
        if refused:  # handed back at once: the emulator's push loop delivers them, with its own retries
            self._emulator.hand_back(subscription, refused)
        if delivered:
            self._emulator.acknowledge(subscription, delivered)
            with self._lock:
                self.pushed += len(delivered)
        return len(received)


class _Emulator:
    """The emulator's Subscriber and Publisher methods the relay calls, over gRPC: its REST adapter logs a dozen
    lines for every request, which cost it more CPU than the call."""

    def __init__(self, channel: grpc.Channel):
        from google.protobuf.empty_pb2 import Empty
        from google.pubsub_v1.types import pubsub as types

        def method(path: str, answer):
            return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=answer.FromString)

        self._types = types
        self._list = method("/google.pubsub.v1.Publisher/ListTopicSubscriptions", types.ListTopicSubscriptionsResponse.pb())
        self._get = method("/google.pubsub.v1.Subscriber/GetSubscription", types.Subscription.pb())
        self._pull = method("/google.pubsub.v1.Subscriber/Pull", types.PullResponse.pb())
        self._ack = method("/google.pubsub.v1.Subscriber/Acknowledge", Empty)
        self._modify = method("/google.pubsub.v1.Subscriber/ModifyAckDeadline", Empty)

    def subscriptions_of(self, topic: str) -> list[str]:
        request = self._types.ListTopicSubscriptionsRequest.pb()(topic=topic, page_size=1000)
        return list(self._list(request, timeout=10).subscriptions)

    def push_endpoint(self, subscription: str) -> str:
        request = self._types.GetSubscriptionRequest.pb()(subscription=subscription)
        return self._get(request, timeout=10).push_config.push_endpoint

    def pull(self, subscription: str, most: int) -> list:
        request = self._types.PullRequest.pb()(subscription=subscription, max_messages=most, return_immediately=True)
        return list(self._pull(request, timeout=10).received_messages)

    def acknowledge(self, subscription: str, ack_ids: list[str]) -> None:
        self._ack(self._types.AcknowledgeRequest.pb()(subscription=subscription, ack_ids=ack_ids), timeout=10)

    def hand_back(self, subscription: str, ack_ids: list[str]) -> None:
        request = self._types.ModifyAckDeadlineRequest.pb()(subscription=subscription, ack_ids=ack_ids,
                                                           ack_deadline_seconds=0)
        self._modify(request, timeout=10)


# ------------------------------------------------------------------------------------------ one port for both
def _splice(source: socket.socket, sink: socket.socket, seen: Callable[[bytes], None] | None = None) -> None:
    """Copy bytes until `source` ends, then end `sink`'s writing side."""
    try:
        while chunk := source.recv(65536):
            if seen is not None:
                seen(chunk)
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _route(client: socket.socket, grpc_address: tuple[str, int], emulator: tuple[str, int],
           published: Callable[[str], None]) -> None:
    try:
        opening = client.recv(len(HTTP2_PREFACE_START), socket.MSG_PEEK | socket.MSG_WAITALL)
        upstream = socket.create_connection(grpc_address if opening == HTTP2_PREFACE_START else emulator, timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pending: list[str] = []  # topics of REST publishes sent on this connection, not yet answered

    def request_bytes(chunk: bytes) -> None:
        pending.extend(m.group(1).decode() for m in REST_PUBLISH.finditer(chunk))

    def answer_bytes(_chunk: bytes) -> None:
        while pending:  # HTTP/1.1 answers in order: the publish was answered
            published(pending.pop(0))

    back = threading.Thread(target=_splice, args=(upstream, client, answer_bytes), daemon=True)
    back.start()
    _splice(client, upstream, request_bytes if opening != HTTP2_PREFACE_START else None)
    back.join()
    client.close()
    upstream.close()


def _accept(listener: socket.socket, grpc_address: tuple[str, int], emulator: tuple[str, int],
            published: Callable[[str], None]) -> None:
    while True:
        try:
            client, _ = listener.accept()
            threading.Thread(target=_route, args=(client, grpc_address, emulator, published), daemon=True).start()
        except Exception as e:  # noqa: BLE001 - only a closed listener ends the loop
            if listener.fileno() == -1:
                return  # closed: stopping
            # Anything else (a connection reset before it was accepted, no descriptor or thread to spare for a
            # moment) ends that one connection, never the port: a dead loop leaves later clients connected to a
            # backlog nobody serves, their calls hanging until their own deadlines.
            log.warning("everyone's port: a connection not served (%r); accepting the next", e)
            time.sleep(0.05)


class Running:
    """A relay serving: its gRPC port (the services'), and its port for everyone (gRPC here, the rest to the emulator)."""

    def __init__(self, pubsub_host: str, port: int, front_urls: list[str], mux_port: int | None = None,
                 notifications: list[NotificationConfig] | None = None):
        self._channel = grpc.insecure_channel(pubsub_host, options=MESSAGE_SIZE_OPTIONS)
        self.relay = Relay(self._channel, front_urls)
        self.notifications = Notifications(notifications or [])
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=MESSAGE_SIZE_OPTIONS,
                                   handlers=[_Forwarder(self._channel, self.relay.published, self.notifications)])
        self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._server.start()
        self._listener = None
        if mux_port:
            host, _, emulator_port = pubsub_host.rpartition(":")
            self._listener = socket.create_server(("127.0.0.1", mux_port), backlog=128)
            threading.Thread(target=_accept, args=(self._listener, ("127.0.0.1", port), (host, int(emulator_port)),
                                                   self.relay.published), daemon=True).start()
        log.info("pubsub relay up on 127.0.0.1:%d (and %s) → %s", port, mux_port, pubsub_host)

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._server.stop(grace=1).wait()
        self._channel.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The local stack's Pub/Sub relay: publishes go to the emulator, "
                                                 "their pushes to the front at once")
    parser.add_argument("--pubsub", required=True, help="the emulator's HOST:PORT")
    parser.add_argument("--port", type=int, required=True, help="gRPC only (the services')")
    parser.add_argument("--mux-port", type=int, help="gRPC to the relay, anything else to the emulator (people's)")
    parser.add_argument("--front-url", action="append", default=[], help="a service's URL on the front (repeat)")
    parser.add_argument("--notifications", default="[]",
                        help="Cloud Storage's notification configs, JSON: [{topic, bucket, prefix, event_types}]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    configs = [NotificationConfig(c["topic"], c["bucket"], c["prefix"], tuple(c["event_types"]))
               for c in json.loads(args.notifications)]
    running = Running(args.pubsub, args.port, args.front_url, args.mux_port, configs)
    stop.wait()
    running.stop()


if __name__ == "__main__":
    main()
