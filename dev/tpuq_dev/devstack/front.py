"""The local stack's stand-in for what Google puts between Pub/Sub and a Cloud Run service.

In production a push travels: Pub/Sub → (ID token added) → Cloud Run's front end (invoker check,
signature removed) → the container. The Pub/Sub emulator sends no token at all, and nothing stands
between it and a local process, so without this front the services' authentication code would never
run locally. One front process serves every service of the stack, each on its own port: that port's
URL is the service's URL, as `https://<service>-<number>.<region>.run.app` is on Cloud Run.

What Google does, and what the front does the same way:

- **Pub/Sub adds the token.** A push subscription with `pushConfig.oidcToken{serviceAccountEmail,
  audience}` sends `Authorization: Bearer <ID token>`: signed by Google, `iss` https://accounts.google.com,
  `aud` the configured audience (the push endpoint when none is set), `email` the account,
  `email_verified` true, valid one hour. The emulator stores `oidcToken` but sends no token. So when a
  request carries no token and its body is a push envelope whose `subscription` the emulator has, with
  `pushEndpoint` exactly this front's URL and path and an `oidcToken`, the front mints the token Pub/Sub
  would have sent. A subscription without `oidcToken` gets no token, as in production.
- **Cloud Run's invoker check** (on by default; deploy keeps it on), on every path, before the container:
  - no token, a bad signature, an expired token, or an audience other than the service's URL
    (or a custom audience; tpuq sets none) → 401;
  - a valid token whose account lacks `roles/run.invoker` on that service → 403. The front takes the
    invoker bindings from infra/iam.yaml exactly as `tpuq deploy` grants them, plus whoever the stack adds
    to stand for the project's owners, who hold run.invoker through roles/owner.
  - `X-Serverless-Authorization`, when sent, is the header checked; `Authorization` then passes unchecked.
- **The signature is removed.** The checked token reaches the container with its signature part replaced
  by the literal `SIGNATURE_REMOVED_BY_GOOGLE` (Cloud Run troubleshooting, "signature-removed"), in the
  header it came in. Header and claims are untouched, so the container can read them but can never verify
  the signature again.
- Cloud Run adds `X-Cloud-Trace-Context` to every request; the front adds one when missing.
- **Request timeout and concurrency** (tpuq_dev.devstack.run_limits): per service (`Route`, from
  infra/services.yaml as deploy sets them), a request the container has not answered within the service's timeout
  gets 504 (the container keeps running it), and past concurrency × max_instances requests in flight one more
  waits up to 60 s for a slot, then gets 429. One process stands for all instances, with one instance's threads:
  it cannot model scaling out, cold starts, or each instance's memory and CPU.

"Google's" signing key is a local RSA key (`LocalGoogleSigner`) in the stack's state directory: tests use
it to sign tokens of other accounts, for other audiences, or to forge one with another key.

**Pub/Sub's push delivery is the front's too** (tpuq_dev.devstack.dispatcher): the emulator's push of a message to a
subscription whose pushEndpoint is one of the front's URLs gets 204 at once, and the front's dispatcher delivers
it as Pub/Sub does: many pushes in flight per subscription (a push window growing with acks and shrinking with
failures), the subscription's ack deadline, retry policy and dead-letter policy (tpuq_dev.devstack.deadlettering),
and `deliveryAttempt`. The emulator alone never has more than 2 pushes in flight per subscription and ignores the
retry policy.

For chaos tests the front can deliver every push more than once (`copies`): Pub/Sub's at-least-once
delivery, on demand. Pub/Sub then sees the answer to the last copy. With `copy_delay_seconds` > 0 the extra
copies go out in the background, each after a random delay up to that many seconds, so they arrive out of
order (after later messages), and Pub/Sub sees the answer to the first copy. With `delivery_log` set, the front
appends one JSON line per delivery its dispatcher makes (`{"service", "subscription", "message_id", "at",
"redelivery"}`): how often each message was delivered, the chaos soak's witness that no message loops.

Run: `python -m tpuq_dev.devstack.front --config FILE` (the stack writes FILE; see `FrontConfig`).
"""

from __future__ import annotations

import argparse
import base64
import os
import hashlib
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import requests
from werkzeug.wrappers import Request, Response

from tpuq.runtime.auth import SERVERLESS_AUTHORIZATION, check_time_and_issuer, split_token, strip_signature
from tpuq_dev.devstack.deadlettering import publish_dead_letter
from tpuq_dev.devstack.dispatcher import Policy, Push, PushDispatcher, Subscriptions
from tpuq_dev.pubsubfilter import FilterError, compiled_filter
from tpuq_dev.devstack.run_limits import RequestGate, ServingLimits

log = logging.getLogger("tpuq_dev.devstack.front")

GOOGLE_ISSUER = "https://accounts.google.com"
TOKEN_LIFETIME_SECONDS = 3600  # Pub/Sub's push tokens last an hour
# A push token is signed once and sent while it has most of its hour left (signing costs ~1 ms a push here); it is
# still checked in full on every request, expiry included.
TOKEN_REUSE_SECONDS = 600
INVOKER_ROLE = "roles/run.invoker"
# Headers a proxy never forwards (RFC 9110 7.6.1), plus those the HTTP client sets itself.
_NOT_FORWARDED = {"connection", "keep-alive", "proxy-authorization", "te", "trailer", "transfer-encoding",
                  "upgrade", "host", "content-length"}


class TokenRejected(ValueError):
    """The invoker check refused the token; `status` is what Cloud Run answers."""

    def __init__(self, reason: str, status: int = 401):
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class LocalGoogleSigner:
    """Plays Google's token service and certificates: signs ID tokens and verifies their signature."""

    private_pem: bytes
    key_id: str = "tpuq-local-google"

    @classmethod
    def generate(cls) -> "LocalGoogleSigner":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))

    @classmethod
    def load_or_create(cls, path: Path) -> "LocalGoogleSigner":
        if not path.exists():
            path.write_bytes(cls.generate().private_pem)
            path.chmod(0o600)
        return cls(path.read_bytes())

    # Loading an RSA key checks it (~50 ms here): once per signer, not once per push.
    @cached_property
    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(self.private_pem, password=None)
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)

    @cached_property
    def _signer(self):
        from google.auth import crypt

        return crypt.RSASigner.from_string(self.private_pem, key_id=self.key_id)

    @cached_property
    def _verifier(self):
        from google.auth import crypt

        return crypt.RSAVerifier.from_string(self.public_pem)

    def mint(self, email: str, audience: str, now: float, **overrides: Any) -> str:
        """An ID token as Google signs it for a service account (`overrides` replace claims, for tests)."""
        from google.auth import jwt

        unique_id = str(int(hashlib.sha256(email.encode()).hexdigest()[:15], 16))  # Google's numeric account id
        claims = {"iss": GOOGLE_ISSUER, "aud": audience, "azp": unique_id, "sub": unique_id, "email": email,
                  "email_verified": True, "iat": int(now), "exp": int(now) + TOKEN_LIFETIME_SECONDS, **overrides}
        return jwt.encode(self._signer, claims).decode()

    def verify(self, token: str, now: float) -> dict[str, Any]:
        """The claims of a token this signer signed and that is still valid, else TokenRejected (401)."""
        try:
            header, claims, signature = split_token(token)
            signed, _, _ = token.rpartition(".")
            raw_signature = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        except ValueError as e:
            raise TokenRejected(f"not an ID token: {e}") from None
        if header.get("alg") != "RS256" or header.get("kid") != self.key_id:
            raise TokenRejected("not signed by a Google key")
        if not self._verifier.verify(signed.encode(), raw_signature):
            raise TokenRejected("the signature does not verify")
        try:
            check_time_and_issuer(claims, now)
        except ValueError as e:
            raise TokenRejected(str(e)) from None
        return claims


@dataclass(frozen=True)
class Route:
    """One Cloud Run service: its URL (the tokens' audience), the container behind it, who may invoke it."""

    service: str
    port: int
    backend: str
    invokers: tuple[str, ...]
    limits: ServingLimits = ServingLimits()  # Cloud Run's (run_limits); its defaults unless the service sets them

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class FrontConfig:
    pubsub_host: str
    key_file: str
    routes: list[Route]
    copies: int = 1  # deliveries of each push to the container (chaos: 2 delivers every push twice)
    copy_delay_seconds: float = 0.0  # > 0: extra copies later, in the background, out of order
    delivery_log: str | None = None  # a JSON line per push received from Pub/Sub, for counting deliveries
    seed: int | None = None  # of the delays' random source
    control_port: int | None = None  # the stack's own port on the front (no service's URL): POST /reset, GET /stats

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> "FrontConfig":
        data = json.loads(path.read_text())
        routes = [Route(**{**r, "invokers": tuple(r["invokers"]), "limits": ServingLimits(**r["limits"])})
                  for r in data.pop("routes")]
        return cls(routes=routes, **data)


def invoker_emails(bindings: Iterable[Any], member: Callable[[str], str], service: str) -> tuple[str, ...]:
    """The accounts infra/iam.yaml grants run.invoker on `service`, as deploy writes them (`Target.member`)."""
    emails = []
    for b in bindings:
        if b.role == INVOKER_ROLE and b.resource == f"run_service:{service}":
            _kind, _, email = member(b.member).partition(":")
            emails.append(email)
    return tuple(sorted(emails))


@dataclass
class Front:
    """One service's front: a WSGI app. Pub/Sub's pushes to it go through its dispatcher (many in flight);
    anyone else's requests straight through Cloud Run's checks."""

    route: Route
    signer: LocalGoogleSigner
    pubsub_host: str
    copies: int = 1
    now: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    copy_delay_seconds: float = 0.0
    delivery_log: Path | None = None
    _log_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # One pool for every thread (a thread per request and per push): connections are reused.
    _session: requests.Session = field(default_factory=requests.Session, repr=False)
    _gate: RequestGate = field(init=False, repr=False)  # the route's timeout and concurrency
    _tokens: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict, repr=False)  # push tokens, minted

    def __post_init__(self) -> None:
        self._gate = RequestGate(self.route.service, self.route.limits)
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=256))
        # The emulator answers a GET in ~25 ms on a loaded machine, and every push would ask.
        self.subscriptions = Subscriptions(self.pubsub_host, self._session)
        self.dispatcher = PushDispatcher(self.deliver_push, self._policy, self._dead_letter)

    def __call__(self, environ, start_response):
        request = Request(environ)
        push = self._pushed_by_pubsub(request)
        if push is not None:
            if self._filtered_out(push):  # acknowledged by Pub/Sub itself: the service never sees it
                return Response(status=204)(environ, start_response)
            self.dispatcher.accept(push)  # the message is the dispatcher's now: the emulator may forget it
            return Response(status=204)(environ, start_response)
        return self.handle(request)(environ, start_response)

    def handle(self, request: Request) -> Response:
        """Someone's own request (a person's, a test's): Cloud Run's invoker check, then the container."""
        header = SERVERLESS_AUTHORIZATION if SERVERLESS_AUTHORIZATION in request.headers else "Authorization"
        scheme, _, token = request.headers.get(header, "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        refused = self._refusal(token)
        if refused is not None:
            log.warning("%s %s refused (%d): %s", self.route.service, request.path, refused.status, refused)
            return _refusal_answer(refused)
        headers = self._forwarded_headers(dict(request.headers), header, token)
        try:
            answer = self._to_container(request.method, self._url(request.full_path), request.get_data(), headers)
        except requests.RequestException as e:  # the container is down: Cloud Run answers 503
            log.warning("%s: container unreachable: %s", self.route.service, e)
            return Response("503 Service Unavailable\n", 503, content_type="text/plain")
        return Response(answer.content, answer.status_code, content_type=answer.headers.get("Content-Type"))

    def deliver_push(self, push: Push, policy: Policy) -> int:
        """One delivery of a push, as Pub/Sub makes it: the ID token its pushConfig asks for, `deliveryAttempt`
        with a dead-letter policy, through Cloud Run's checks. Its status (NO_ANSWER: the container is down)."""
        config = ((self.subscriptions.get(push.subscription) or {}).get("pushConfig") or {})
        oidc = config.get("oidcToken") or {}
        token = (self._push_token(oidc["serviceAccountEmail"], oidc.get("audience") or config["pushEndpoint"])
                 if oidc.get("serviceAccountEmail") else "")
        envelope = dict(push.envelope)
        if policy.max_delivery_attempts is not None:
            envelope["deliveryAttempt"] = push.attempts
        body = json.dumps(envelope).encode()
        self._log_delivery(push, redelivery=push.attempts > 1)
        refused = self._refusal(token)
        if refused is not None:
            log.warning("%s %s refused (%d): %s", self.route.service, push.path, refused.status, refused)
            return refused.status
        headers = self._forwarded_headers(push.headers, "Authorization", token)
        url = self._url(push.path)
        copies = self.copies
        if copies > 1 and self.copy_delay_seconds > 0:
            for _ in range(copies - 1):
                threading.Thread(target=self._deliver_later, args=(url, body, headers,
                                                                   self.rng.uniform(0, self.copy_delay_seconds)),
                                 daemon=True).start()
            copies = 1
        try:
            for _ in range(copies):  # Pub/Sub sees the last copy's answer
                answer = self._to_container("POST", url, body, headers)
        except requests.RequestException as e:  # the container is down: Cloud Run answers 503
            log.warning("%s: container unreachable: %s", self.route.service, e)
            return 503
        return answer.status_code

    def _policy(self, subscription: str) -> Policy | None:
        """The subscription's delivery policy; None once it is gone or pushes elsewhere (its messages dropped)."""
        body = self.subscriptions.get(subscription)
        if body is None:
            return None
        endpoint = (body.get("pushConfig") or {}).get("pushEndpoint")
        if body and not (endpoint or "").startswith(self.route.url + "/"):
            return None
        return Policy.of(body)

    def reset(self) -> int:
        """The emulator was reset: drop what the dispatcher holds, read subscriptions again."""
        self.subscriptions.forget()
        return self.dispatcher.clear()

    def _push_token(self, email: str, audience: str) -> str:
        now = self.now()
        minted = self._tokens.get((email, audience))
        if minted is None or now - minted[1] >= TOKEN_REUSE_SECONDS:
            minted = (self.signer.mint(email, audience, now), now)
            self._tokens[(email, audience)] = minted
        return minted[0]

    def _refusal(self, token: str) -> TokenRejected | None:
        try:
            if not token:
                raise TokenRejected("no ID token")
            self._check_invoker(token)
        except TokenRejected as e:
            return e
        return None

    def _forwarded_headers(self, headers: dict, header: str, token: str) -> dict:
        headers = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
        headers[header] = f"Bearer {strip_signature(token)}"
        headers.setdefault("X-Cloud-Trace-Context", f"{self.rng.getrandbits(128):032x}/{self.rng.getrandbits(63)};o=1")
        return headers

    def _url(self, full_path: str) -> str:
        return self.route.backend.rstrip("/") + full_path.rstrip("?")

    def _to_container(self, method: str, url: str, body: bytes, headers: dict) -> requests.Response:
        """One request to the container, through Cloud Run's timeout and concurrency (429, 504: run_limits)."""
        return self._gate.send(lambda: self._session.request(method, url, data=body, headers=headers, timeout=3600))

    def _deliver_later(self, url: str, body: bytes, headers: dict, delay: float) -> None:
        time.sleep(delay)  # a background copy: its answer goes nowhere, as a redelivery's would be Pub/Sub's alone
        try:
            self._to_container("POST", url, body, headers)
        except requests.RequestException as e:
            log.warning("%s: late copy not delivered: %s", self.route.service, e)

    def _dead_letter(self, push: Push, policy: Policy) -> bool:
        return publish_dead_letter(self._session, self.pubsub_host, push.envelope, push.attempts,
                                   policy.dead_letter_topic or "")

    def _log_delivery(self, push: Push, redelivery: bool, filtered: bool = False) -> None:
        """A line of the delivery log: a push made, or (`filtered`) a message the subscription's filter left out."""
        if self.delivery_log is None:
            return
        entry = {"service": self.route.service, "subscription": push.subscription, "message_id": push.message_id,
                 "at": round(self.now(), 3), "redelivery": redelivery}
        if filtered:
            entry["filtered"] = True
        line = json.dumps(entry)
        with self._log_lock, open(self.delivery_log, "a") as f:
            f.write(line + "\n")

    def _check_invoker(self, token: str) -> None:
        claims = self.signer.verify(token, self.now())
        audiences = claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")]
        if not {self.route.url, self.route.url + "/"} & set(audiences):
            raise TokenRejected(f"audience {claims.get('aud')} is not this service's URL {self.route.url}")
        if claims.get("email") not in self.route.invokers:
            raise TokenRejected(f"{claims.get('email')} does not have {INVOKER_ROLE} on {self.route.service}", 403)

    def _filtered_out(self, push: Push) -> bool:
        """Whether the subscription's filter, which the emulator stores but does not apply, leaves this message out
        (tpuq_dev.pubsubfilter). A filter Pub/Sub would have refused leaves every message out."""
        text = (self.subscriptions.get(push.subscription) or {}).get("filter") or ""
        if not text:
            return False
        try:
            matches = compiled_filter(text)
        except FilterError as e:
            log.error("%s: filter %r is one Pub/Sub refuses (%s): the subscription could not exist; message %s "
                      "not delivered", push.subscription, text, e, push.message_id)
            return True
        attributes = push.envelope["message"].get("attributes") or {}
        if matches(attributes):
            return False
        self._log_delivery(push, redelivery=False, filtered=True)
        return True

    def _pushed_by_pubsub(self, request: Request) -> Push | None:
        """The emulator's push of a message to a subscription that pushes to this URL and path, else None. The
        emulator sends no token: a request with one is someone's own."""
        if request.method != "POST" or any(h in request.headers for h in (SERVERLESS_AUTHORIZATION, "Authorization")):
            return None
        try:
            envelope = json.loads(request.get_data() or b"null")
        except ValueError:
            return None
        if not isinstance(envelope, dict) or not isinstance(envelope.get("message"), dict):
            return None
        name = envelope.get("subscription")
        if not isinstance(name, str) or not envelope["message"].get("messageId"):
            return None
        config = (self.subscriptions.get(name) or {}).get("pushConfig") or {}
        if config.get("pushEndpoint") != self.route.url + request.path:
            return None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        return Push(name, request.full_path.rstrip("?"), envelope, headers)


def _refusal_answer(refused: TokenRejected) -> Response:
    word = "Unauthorized" if refused.status == 401 else "Forbidden"
    return Response(f"{refused.status} {word}: {refused}\n", refused.status, content_type="text/plain")


def control_app(fronts: list[Front]):
    """The stack's own handle on the front, on a port of its own (Cloud Run has no such thing: no service URL
    reaches it): `POST /reset` drops what the dispatchers hold when the stack resets the emulator between tests (a
    deleted subscription's messages are gone in Pub/Sub too); `GET /stats` shows each subscription's push window."""

    @Request.application
    def app(request: Request) -> Response:
        if request.method == "POST" and request.path == "/reset":
            return Response(json.dumps({"dropped": sum(front.reset() for front in fronts)}),
                            content_type="application/json")
        if request.method == "GET" and request.path == "/stats":
            return Response(json.dumps({f.route.service: f.dispatcher.stats() for f in fronts}),
                            content_type="application/json")
        return Response("not found\n", 404, content_type="text/plain")

    return app


def serve(config: FrontConfig, stop: threading.Event) -> None:
    from werkzeug.serving import make_server

    signer = LocalGoogleSigner.load_or_create(Path(config.key_file))
    rng = random.Random(config.seed)
    log_file = Path(config.delivery_log) if config.delivery_log else None
    fronts = [Front(route, signer, config.pubsub_host, copies=config.copies, rng=random.Random(rng.getrandbits(64)),
                    copy_delay_seconds=config.copy_delay_seconds, delivery_log=log_file)
              for route in config.routes]
    servers = [make_server("127.0.0.1", front.route.port, front, threaded=True) for front in fronts]
    if config.control_port:
        servers.append(make_server("127.0.0.1", config.control_port, control_app(fronts), threaded=True))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    log.info("front up: %s", ", ".join(f"{r.service} {r.url} → {r.backend}" for r in config.routes))
    stop.wait()
    for s in servers:
        s.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The local stand-in for Pub/Sub's push token and Cloud Run's "
                                                 "invoker check")
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    from tpuq.runtime import logs

    logs.setup(env=dict(os.environ))
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request would drown the refusals
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serve(FrontConfig.read(args.config), stop)


if __name__ == "__main__":
    main()
