"""Cloud Run's request timeout and concurrency, as the local front (tpuq_dev.devstack.front) enforces them.

What Google does:

- **Request timeout** (`template.timeout`, default 300 s, at most 3600 s): "If your service doesn't respond within
  this limit, Cloud Run closes the network connection and returns an HTTP 504 error. Closing the connection
  doesn't terminate the container instance. The container might continue processing the aborted request"
  (https://cloud.google.com/run/docs/configuring/request-timeout). To a Pub/Sub push a 504 is a nack: the
  message is redelivered, while the first handler may still be running.
- **Concurrency** (`maxInstanceRequestConcurrency`, default 80) and **maximum instances** (default 100): Cloud Run
  sends one instance at most `concurrency` requests at once and starts no more than `max_instances` instances.
  Past concurrency × max instances, "incoming requests can be queued for up to 60 seconds. During this 60 second
  window, if an instance finishes processing requests, it becomes available to process queued requests. If no
  instances become available during the 60 second window, the request fails with a 429 error code"
  (https://cloud.google.com/run/docs/about-instance-autoscaling, "Exceeding maximum instances"). A 429 is a
  nack too.

What the front does: per service, at most concurrency × max_instances requests in flight to the container; one
more waits up to QUEUE_SECONDS for a slot, then gets 429. A request the container has not answered within the
timeout gets 504, and its slot is free again (Cloud Run closed the connection); the container keeps running it,
holding one of its threads, as on Cloud Run.

What it cannot: locally one process stands for all of a service's instances, with one instance's threads
(Infra.server_env: `concurrency`). Requests past `concurrency` but within concurrency × max_instances wait in
that process's accept queue, their time counting against the timeout, where Cloud Run would start another
instance: the local stack is slower under load than production, never more lenient. Cold starts, each
instance's memory limit and its own CPU are not modelled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import requests

log = logging.getLogger("tpuq_dev.devstack.front")

# Cloud Run's defaults, for a route that names none (run v2 Service: template.timeout 300 s,
# maxInstanceRequestConcurrency 80; "By default, Cloud Run services have a maximum of 100 instances":
# https://cloud.google.com/run/docs/configuring/max-instances-limits).
DEFAULT_TIMEOUT_SECONDS = 300.0
DEFAULT_CONCURRENCY = 80
DEFAULT_MAX_INSTANCES = 100
QUEUE_SECONDS = 60.0  # how long a request past every instance's concurrency waits for one (then 429)

NO_INSTANCE = "The request was aborted because there was no available instance."
TIMED_OUT = "upstream request timeout"


def front_answer(status: int, text: str) -> requests.Response:
    """An answer Cloud Run's front makes itself, shaped as the container's answers are."""
    answer = requests.Response()
    answer.status_code = status
    answer._content = f"{status} {text}\n".encode()
    answer.headers["Content-Type"] = "text/plain"
    return answer


@dataclass(frozen=True)
class ServingLimits:
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    concurrency: int = DEFAULT_CONCURRENCY
    max_instances: int = DEFAULT_MAX_INSTANCES
    queue_seconds: float = QUEUE_SECONDS

    @property
    def in_flight(self) -> int:
        """Requests the service's instances hold at once, all of them busy."""
        return self.concurrency * self.max_instances


class RequestGate:
    """One service's limits, shared by every request thread of its front."""

    def __init__(self, service: str, limits: ServingLimits):
        self.service = service
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.in_flight)

    def send(self, request: Callable[[], requests.Response]) -> requests.Response:
        """`request()` (one request to the container) within the limits: its answer, or the front's 429 or 504.
        An exception of `request()` (the container unreachable) is raised here."""
        if not self._slots.acquire(timeout=self.limits.queue_seconds):
            log.warning("%s: %d requests in flight (concurrency %d × %d instances) for %.0f s: 429", self.service,
                        self.limits.in_flight, self.limits.concurrency, self.limits.max_instances,
                        self.limits.queue_seconds)
            return front_answer(429, NO_INSTANCE)
        outcome: dict[str, object] = {}
        done = threading.Event()

        def run() -> None:
            try:
                outcome["answer"] = request()
            except BaseException as e:  # handed to the waiting thread
                outcome["error"] = e
            finally:
                done.set()

        try:
            # A thread of its own, so that the container keeps the request after the front's 504.
            threading.Thread(target=run, daemon=True).start()
            if not done.wait(self.limits.timeout_seconds):
                log.warning("%s: no answer within the request timeout (%.0f s): 504", self.service,
                            self.limits.timeout_seconds)
                return front_answer(504, TIMED_OUT)
        finally:
            self._slots.release()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["answer"]  # type: ignore[return-value]
