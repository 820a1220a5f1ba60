"""The front enforces Cloud Run's request timeout and concurrency (tpuq_dev.devstack.run_limits), in-process:
a front before a slow WSGI container, no stack."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tpuq_dev.devstack import processes
from tpuq_dev.devstack.front import Front, LocalGoogleSigner, Route
from tpuq_dev.devstack.run_limits import NO_INSTANCE, ServingLimits

from tests.helpers import wait_until

PUSHER = "tpuq-push@tpuq-local.iam.gserviceaccount.com"


class Container:
    """A container whose requests take as long as the test says: `?sleep=S`, or until `release(name)`."""

    def __init__(self):
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def release(self, name: str) -> None:
        self.gates.setdefault(name, threading.Event()).set()

    @Request.application
    def __call__(self, request: Request) -> Response:
        name = request.args.get("name", request.path)
        with self.lock:
            self.started.append(name)
            gate = self.gates.setdefault(name, threading.Event())
        if "sleep" in request.args:
            time.sleep(float(request.args["sleep"]))
        else:
            gate.wait(30)
        with self.lock:
            self.finished.append(name)
        return Response("done", 200)


@pytest.fixture(scope="module")
def signer() -> LocalGoogleSigner:
    return LocalGoogleSigner.generate()


@pytest.fixture
def front(signer, tmp_path):
    """start(**route_limits, **front_options) -> (Route, Container): a front on its own port before a container."""
    servers = []

    def start(front_options: dict | None = None, **limits) -> tuple[Route, Container]:
        container = Container()
        backend = make_server("127.0.0.1", 0, container, threaded=True)
        route = Route("probe", processes.free_port(), f"http://127.0.0.1:{backend.server_port}", (PUSHER,), ServingLimits(**limits))
        server = make_server("127.0.0.1", route.port, Front(route, signer, "unused:0", **(front_options or {})),
                             threaded=True)
        for s in (backend, server):
            threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
            servers.append(s)
        return route, container

    yield start
    for s in servers:
        s.shutdown()


def call(signer: LocalGoogleSigner, route: Route, query: str, body: bytes = b"{}") -> requests.Response:
    token = signer.mint(PUSHER, route.url, time.time())
    return requests.post(f"{route.url}/push/probe?{query}", data=body, timeout=30,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def test_a_request_past_the_services_timeout_gets_504_and_the_container_keeps_running_it(front, signer):
    route, container = front(timeout_seconds=1)
    started = time.monotonic()
    answer = call(signer, route, "name=slow&sleep=2")
    assert answer.status_code == 504, answer.text
    assert time.monotonic() - started >= 1.0
    assert container.finished == []  # still running when Pub/Sub got its 504
    wait_until(lambda: container.finished == ["slow"], timeout=10, what="the container finishing the request")
    # Within the timeout, the container's own answer.
    assert call(signer, route, "name=quick&sleep=0").status_code == 200


def test_past_concurrency_times_instances_a_request_waits_for_a_slot_then_gets_429(front, signer):
    route, container = front(concurrency=2, max_instances=2, queue_seconds=1)
    in_flight = route.limits.in_flight
    with ThreadPoolExecutor(in_flight + 2) as pool:
        held = [pool.submit(call, signer, route, f"name=held-{i}") for i in range(in_flight)]
        wait_until(lambda: len(container.started) == in_flight, timeout=10, what="every slot taken")

        started = time.monotonic()
        refused = call(signer, route, "name=refused")
        assert refused.status_code == 429 and NO_INSTANCE in refused.text
        assert time.monotonic() - started >= 1.0  # it waited in Cloud Run's queue first
        assert "refused" not in container.started  # never reached the container

        # A request that finds a slot freed while it waits is served.
        queued = pool.submit(call, signer, route, "name=queued&sleep=0")
        time.sleep(0.2)
        container.release("held-0")
        assert queued.result().status_code == 200
        for i in range(1, in_flight):
            container.release(f"held-{i}")
        assert [f.result().status_code for f in held] == [200] * in_flight
