"""Pushes reach the stack's services as they reach Cloud Run services: through the front (tpuq_dev.devstack.front).

The services run in production's push-auth mode. The front adds the ID token Pub/Sub would send for the
subscription's push account, refuses what Cloud Run's invoker check refuses, and forwards the token with its
signature removed, so the authentication code that runs in production runs in every stack test.
"""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tpuq.contracts import store, topology
from tpuq.runtime.auth import SIGNATURE_REMOVED, PushAuth, split_token, strip_signature
from tpuq_dev.devstack import processes
from tpuq_dev.devstack.front import Front, LocalGoogleSigner, Route
from tpuq_dev.devstack.stack import LOCAL_PROJECT_OWNER

from tests.helpers import wait_until


@pytest.fixture
def google(stack) -> LocalGoogleSigner:
    return LocalGoogleSigner.load_or_create(stack.google_key_file)


@pytest.fixture
def push_account(stack) -> str:
    target, infra = stack.deployment()
    return target.sa_email(infra.pubsub.push_service_account)


def envelope(data: dict, message_id: str, subscription: str) -> dict:
    return {"message": {"data": base64.b64encode(json.dumps(data).encode()).decode(), "messageId": message_id,
                        "attributes": {}},
            "subscription": f"projects/tpuq-local/subscriptions/{subscription}"}


def test_a_published_job_is_stored_through_the_front(clean_stack, clients):
    """Fails while the service verifies the signature that the front, as Cloud Run, removed."""
    clients.publish("jobs", {"id": "through-front", "tpu": "v4-8", "command": "echo 1"})
    job = wait_until(lambda: clients.firestore.collection(store.JOBS).document("through-front").get().to_dict(),
                     timeout=30, what="the job stored by the scheduler")
    assert job["state"] == "pending"
    assert list(clients.firestore.collection(store.DEAD_LETTERS).stream()) == []


def test_the_stack_declares_the_push_config_deploy_creates(clean_stack, push_account):
    host = clean_stack.env["PUBSUB_EMULATOR_HOST"]
    subs = requests.get(f"http://{host}/v1/projects/{clean_stack.project}/subscriptions", timeout=10).json()
    pushes = {s["name"].rsplit("/", 1)[-1]: s["pushConfig"] for s in subs["subscriptions"]}
    assert "scheduler-jobs" in pushes and "executor-assignments" in pushes
    # ... and the hold subscription, a pull subscription that keeps what is dead-lettered for people to read.
    assert not pushes.pop(topology.DEAD_LETTER_HOLD_SUBSCRIPTION).get("pushEndpoint")
    for name, push in pushes.items():
        service = name.split("-", 1)[0]
        url = clean_stack.env[f"TPUQ_{service.upper()}_URL"]
        assert push["pushEndpoint"].startswith(url + "/push/"), name
        assert push["oidcToken"] == {"serviceAccountEmail": push_account, "audience": url}, name


@pytest.fixture
def probe(clean_stack, push_account):
    """A front (the same class the stack runs) before a container that records what it receives and answers
    with the service's own auth check, on a topic and push subscription of its own."""
    received: list[dict] = []
    auth = PushAuth(mode="oidc", service_account=push_account)

    holding = {"now": 0, "most": 0, "seconds": 0.0}
    lock = threading.Lock()

    @Request.application
    def container(request: Request) -> Response:
        with lock:
            received.append({"headers": dict(request.headers), "body": request.get_json()})
            holding["now"] += 1
            holding["most"] = max(holding["most"], holding["now"])
        time.sleep(holding["seconds"])
        with lock:
            holding["now"] -= 1
        refused = auth.check(dict(request.headers), "probe")
        return Response(refused[0], refused[1]) if refused else Response("", 204)

    backend = make_server("127.0.0.1", 0, container, threaded=True)
    fronts = []

    def start(copies: int = 1, **options) -> Front:
        route = Route("probe", processes.free_port(), f"http://127.0.0.1:{backend.server_port}", (push_account,))
        auth.audience = route.url
        front = Front(route, LocalGoogleSigner.load_or_create(clean_stack.google_key_file),
                      clean_stack.env["PUBSUB_EMULATOR_HOST"], copies=copies, **options)
        server = make_server("127.0.0.1", route.port, front, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        fronts.append(server)
        base = f"http://{clean_stack.env['PUBSUB_EMULATOR_HOST']}/v1/projects/{clean_stack.project}"
        requests.put(f"{base}/topics/front-probe", json={}, timeout=10).raise_for_status()
        requests.put(f"{base}/subscriptions/front-probe", timeout=10, json={
            "topic": f"projects/{clean_stack.project}/topics/front-probe", "pushConfig": {
                "pushEndpoint": route.url + "/push/probe",
                "oidcToken": {"serviceAccountEmail": push_account, "audience": route.url}}}).raise_for_status()
        return front

    threading.Thread(target=backend.serve_forever, daemon=True).start()
    start.holding = holding  # type: ignore[attr-defined]
    yield start, received, clean_stack
    for server in fronts:
        server.app.dispatcher.stop()
    for server in [*fronts, backend]:
        server.shutdown()


def publish_probe(stack, data: dict) -> None:
    base = f"http://{stack.env['PUBSUB_EMULATOR_HOST']}/v1/projects/{stack.project}"
    message = {"data": base64.b64encode(json.dumps(data).encode()).decode()}
    requests.post(f"{base}/topics/front-probe:publish", json={"messages": [message]}, timeout=10).raise_for_status()


def test_the_container_gets_the_push_accounts_token_with_its_signature_removed(probe, push_account):
    start, received, stack = probe
    front = start()
    publish_probe(stack, {"hello": 1})
    wait_until(lambda: received, timeout=30, what="the push at the container")
    headers = received[0]["headers"]
    scheme, _, token = headers["Authorization"].partition(" ")
    header, claims, signature = split_token(token)
    assert scheme == "Bearer" and signature == SIGNATURE_REMOVED
    assert header["alg"] == "RS256"
    assert claims["email"] == push_account and claims["email_verified"] is True
    assert claims["aud"] == front.route.url and claims["iss"] == "https://accounts.google.com"
    assert "X-Cloud-Trace-Context" in headers
    assert received[0]["body"]["subscription"].endswith("/subscriptions/front-probe")
    # the service's own check accepted it: the push was acknowledged once, not redelivered
    assert len(received) == 1


def test_the_front_can_deliver_every_push_twice(probe):
    start, received, stack = probe
    start(copies=2)
    publish_probe(stack, {"hello": 2})
    wait_until(lambda: len(received) >= 2, timeout=30, what="both copies at the container")
    assert len({r["body"]["message"]["messageId"] for r in received}) == 1


def test_a_late_copy_arrives_after_the_answer_and_the_log_counts_pubsubs_pushes(probe, tmp_path):
    """The chaos soak's front: the second copy goes out later, in the background (out of order), and the
    delivery log counts what Pub/Sub pushed (once), not the copies."""
    start, received, stack = probe
    log_file = tmp_path / "deliveries.jsonl"
    start(copies=2, copy_delay_seconds=1.0, delivery_log=log_file)
    publish_probe(stack, {"hello": 3})
    wait_until(lambda: len(received) >= 2, timeout=30, what="both copies at the container")
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [entry["message_id"] for entry in lines] == [received[0]["body"]["message"]["messageId"]]
    assert lines[0]["service"] == "probe" and lines[0]["subscription"].endswith("/subscriptions/front-probe")


@pytest.fixture
def scheduler_url(clean_stack) -> str:
    return clean_stack.env["TPUQ_SCHEDULER_URL"]


def tick_push(url: str, headers: dict | None = None, subscription: str = "scheduler-ticks") -> requests.Response:
    return requests.post(url + "/push/ticks", json=envelope({"seq": 1}, f"t-{time.monotonic_ns()}", subscription),
                         headers=headers or {}, timeout=30)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_the_push_accounts_own_token_is_accepted(scheduler_url, google, push_account):
    response = tick_push(scheduler_url, bearer(google.mint(push_account, scheduler_url, time.time())))
    assert response.status_code == 204


def test_refusals_come_from_the_layer_that_refuses_them_in_production(stack, scheduler_url, google, push_account):
    now = time.time()
    stranger = LocalGoogleSigner.generate()
    janitor_url = stack.env["TPUQ_JANITOR_URL"]
    cases = {
        # Cloud Run's invoker check (the front): 401 without a valid token for this URL
        "no token, not a push": (requests.post(scheduler_url + "/push/ticks", json={"x": 1}, timeout=30), 401, True),
        "no token, no such subscription": (tick_push(scheduler_url, subscription="nope"), 401, True),
        "forged signature": (tick_push(scheduler_url, bearer(stranger.mint(push_account, scheduler_url, now))), 401,
                             True),
        "signature already removed": (
            tick_push(scheduler_url, bearer(strip_signature(google.mint(push_account, scheduler_url, now)))), 401,
            True),
        "another service's audience": (tick_push(scheduler_url, bearer(google.mint(push_account, janitor_url, now))),
                                       401, True),
        "expired": (tick_push(scheduler_url, bearer(google.mint(push_account, scheduler_url, now - 7200))), 401,
                    True),
        # ... and 403 for an account without run.invoker on the service
        "no run.invoker": (tick_push(scheduler_url, bearer(google.mint("mallory@example.org", scheduler_url, now))),
                           403, True),
        # The service itself: an owner's token passes Cloud Run's check, but is not a push
        "owner's own token": (tick_push(scheduler_url, bearer(google.mint(LOCAL_PROJECT_OWNER, scheduler_url, now))),
                              403, False),
        "push claims in the unchecked header": (tick_push(scheduler_url, {
            "X-Serverless-Authorization": f"Bearer {google.mint(LOCAL_PROJECT_OWNER, scheduler_url, now)}",
            "Authorization": f"Bearer {strip_signature(google.mint(push_account, scheduler_url, now))}"}), 403,
            False),
    }
    for name, (response, status, by_front) in cases.items():
        assert response.status_code == status, (name, response.text)
        # the front answers as Cloud Run does ("401 Unauthorized: ..."); the service in its own words
        assert response.text.startswith(("401 ", "403 ")) == by_front, (name, response.text)


def test_the_services_run_in_productions_push_auth_mode(stack):
    """Straight to the process, past the front: the service itself refuses a push without a token."""
    response = tick_push(stack.backend_urls["scheduler"])
    assert response.status_code == 401 and response.text == "unauthorized: no bearer token"


def test_pubsub_adds_a_token_only_for_a_subscription_configured_with_one(probe, push_account):
    """As in production: a push subscription without oidcToken sends no token, and one that pushes elsewhere
    is not this service's: the front then refuses as Cloud Run would."""
    start, received, stack = probe
    front = start()
    base = f"http://{stack.env['PUBSUB_EMULATOR_HOST']}/v1/projects/{stack.project}"
    declared = {
        "front-probe-no-oidc": {"pushEndpoint": front.route.url + "/push/probe"},
        "front-probe-elsewhere": {"pushEndpoint": "http://127.0.0.1:9/push/probe",
                                  "oidcToken": {"serviceAccountEmail": push_account, "audience": front.route.url}},
    }
    for name, push_config in declared.items():
        requests.put(f"{base}/subscriptions/{name}", timeout=10, json={
            "topic": f"projects/{stack.project}/topics/front-probe", "pushConfig": push_config}).raise_for_status()
    for name in [*declared, "front-probe"]:
        body = {**envelope({"x": 1}, f"direct-{name}", name),
                "subscription": f"projects/{stack.project}/subscriptions/{name}"}
        response = requests.post(front.route.url + "/push/probe", json=body, timeout=30)
        # Pushes to this URL are Pub/Sub's, taken at once; one that pushes elsewhere is nobody's: 401.
        assert response.status_code == (401 if name == "front-probe-elsewhere" else 204), (name, response.text)
    def direct() -> list[str]:
        return [r["body"]["message"]["messageId"] for r in received
                if r["body"]["message"]["messageId"].startswith("direct-")]

    wait_until(lambda: front.dispatcher.stats().get(f"projects/{stack.project}/subscriptions/front-probe-no-oidc",
                                                    {}).get("delivered", 0) >= 2 and direct(), timeout=30,
               what="the push without a token refused and delivered again")
    assert direct() == ["direct-front-probe"], front.dispatcher.stats()  # the one without a token: never there


def test_pushes_of_one_subscription_are_many_in_flight_through_the_emulator(probe):
    """The emulator alone never has more than 2 pushes in flight per subscription; Pub/Sub (and the front's
    dispatcher) many: 24 messages of a handler taking 0.5 s arrive several at once."""
    start, received, stack = probe
    start.holding["seconds"] = 0.5
    start()
    for i in range(24):
        publish_probe(stack, {"n": i})
    wait_until(lambda: len(received) >= 24, timeout=60, what="every message at the container")
    assert start.holding["most"] > 2, start.holding
