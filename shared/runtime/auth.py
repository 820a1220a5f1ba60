"""Push authentication: deployed services accept only the pushes of the push service account.

How a push reaches a deployed service (the design, and why, is in docs/ARCHITECTURE.md, "Push authentication"):

1. Pub/Sub signs an ID token of the push service account (`tpuq-push@...`) for the audience `tpuq deploy`
   sets on the subscription: the receiving service's URL.
2. Cloud Run's invoker check (IAM; deploy keeps it on: `invokerIamDisabled: false`) verifies that token's
   signature, expiry and audience (401 otherwise) and that its account holds `roles/run.invoker` on the
   service (403 otherwise). Only `tpuq-push` is granted it (infra/iam.yaml); project owners, editors and
   Cloud Run admins hold it implicitly.
3. Cloud Run forwards the token to the container with its signature replaced by the literal
   `SIGNATURE_REMOVED_BY_GOOGLE`. The header and the claims are intact. If the caller sent
   `X-Serverless-Authorization`, Cloud Run checked that header (and stripped it), and passed `Authorization`
   on untouched, unchecked.

So in deployed mode (`TPUQ_PUSH_AUTH=oidc`, with `TPUQ_PUSH_AUDIENCE` and `TPUQ_PUSH_SERVICE_ACCOUNT`) the
service reads the token Cloud Run checked (`X-Serverless-Authorization` when present, else
`Authorization`) and:

- no token, a malformed one, an expired one, one from another issuer -> 401
- a token whose signature is NOT the removed marker (it did not come through the invoker check) -> its
  signature is verified against Google's certificates (google-auth); if that fails -> 401
- a token for another audience or another account, or with an unverified email -> 403: an owner's own
  token passes Cloud Run's check but is not a push

Locally (`TPUQ_PUSH_AUTH` unset or `off`) nothing is checked, and the log says so once. The local stack does
not run that way: its front (tpuq_dev.devstack.front) does what Cloud Run does, and the services run in
deployed mode behind it. The verifier and the clock are injectable.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tpuq.runtime.auth")

ENV_MODE = "TPUQ_PUSH_AUTH"
ENV_AUDIENCE = "TPUQ_PUSH_AUDIENCE"
ENV_SERVICE_ACCOUNT = "TPUQ_PUSH_SERVICE_ACCOUNT"
MODE_OFF = "off"
MODE_OIDC = "oidc"

# What Cloud Run puts in place of the signature of a token its invoker check verified.
SIGNATURE_REMOVED = "SIGNATURE_REMOVED_BY_GOOGLE"
# The header Cloud Run checks instead of Authorization when a caller sends it.
SERVERLESS_AUTHORIZATION = "X-Serverless-Authorization"
GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")  # as google-auth accepts them
CLOCK_SKEW_SECONDS = 10

# (token) -> claims, or raises ValueError / google.auth.exceptions.GoogleAuthError when the token does not verify.
TokenVerifier = Callable[[str], Mapping[str, Any]]


class PushAuthConfigError(RuntimeError):
    """Deployed mode is asked for but not fully configured: refuse everything rather than accept anything."""


class MalformedToken(ValueError):
    """Not a JWT: three base64url parts, the first two JSON objects."""


def google_oidc_verifier(request=None) -> TokenVerifier:
    """Signature, expiry and issuer checked by google-auth against Google's certificates.

    The audience is checked by `PushAuth` itself, so that a wrong audience is a 403, not a 401.
    `request` is a google.auth transport; tests pass one that serves a local certificate.
    """
    from google.auth.transport import requests as google_requests
    from google.oauth2 import id_token

    transport = request or google_requests.Request()

    def verify(token: str) -> Mapping[str, Any]:
        return id_token.verify_oauth2_token(token, transport, audience=None)

    return verify


def _b64url_json(part: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise MalformedToken(f"the token's {what} is not base64url JSON") from None
    if not isinstance(value, dict):
        raise MalformedToken(f"the token's {what} is not a JSON object")
    return value


def split_token(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(header, claims, signature part) of a JWT, nothing verified."""
    parts = token.split(".")
    if len(parts) != 3:
        raise MalformedToken(f"the token has {len(parts)} parts, a JWT has 3")
    return _b64url_json(parts[0], "header"), _b64url_json(parts[1], "claims"), parts[2]


def strip_signature(token: str) -> str:
    """The token as Cloud Run forwards it once its invoker check verified it."""
    signed, _, _signature = token.rpartition(".")
    return f"{signed}.{SIGNATURE_REMOVED}"


def checked_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token Cloud Run's invoker check looks at: X-Serverless-Authorization if sent, else Authorization."""
    lower = {k.lower(): v for k, v in headers.items()}
    serverless = SERVERLESS_AUTHORIZATION.lower()
    header = lower[serverless] if serverless in lower else lower.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def check_time_and_issuer(claims: Mapping[str, Any], now: float) -> None:
    """What google-auth checks besides the signature: raises ValueError when the token is expired or not Google's."""
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise ValueError("the token has no numeric exp")
    if now > exp + CLOCK_SKEW_SECONDS:
        raise ValueError(f"the token expired {int(now - exp)} s ago")
    if isinstance(iat, (int, float)) and iat > now + CLOCK_SKEW_SECONDS:
        raise ValueError("the token is issued in the future")
    if claims.get("iss") not in GOOGLE_ISSUERS:
        raise ValueError(f"the token's issuer {claims.get('iss')!r} is not Google's")


@dataclass
class PushAuth:
    mode: str = MODE_OFF
    audience: str | None = None
    service_account: str | None = None
    verifier: TokenVerifier | None = None
    now: Callable[[], float] = time.time
    _announced: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], verifier: TokenVerifier | None = None,
                 now: Callable[[], float] = time.time) -> "PushAuth":
        """From the service's settings (`Settings.env`, read once at its start)."""
        mode = (env.get(ENV_MODE) or MODE_OFF).strip().lower()
        if mode not in (MODE_OFF, MODE_OIDC):
            raise PushAuthConfigError(f"${ENV_MODE} must be '{MODE_OFF}' or '{MODE_OIDC}', not {mode!r}")
        auth = cls(mode=mode, audience=env.get(ENV_AUDIENCE) or None,
                   service_account=env.get(ENV_SERVICE_ACCOUNT) or None, verifier=verifier, now=now)
        if mode == MODE_OIDC and not (auth.audience and auth.service_account):
            raise PushAuthConfigError(f"${ENV_MODE}=oidc needs ${ENV_AUDIENCE} and ${ENV_SERVICE_ACCOUNT}")
        return auth

    @property
    def enabled(self) -> bool:
        return self.mode == MODE_OIDC

    def check(self, headers: Mapping[str, str], service: str = "") -> tuple[str, int] | None:
        """None when the request may proceed, else the (body, status) refusal."""
        if not self.enabled:
            self._announce_off(service)
            return None
        token = checked_token(headers)
        if token is None:
            return "unauthorized: no bearer token", 401
        try:
            claims = self._claims(token)
        except Exception as e:  # noqa: BLE001 - any verification failure is the caller's fault: 401
            log.warning("push refused: token does not verify: %s", e)
            return "unauthorized: invalid token", 401
        audiences = claims.get("aud")
        audiences = audiences if isinstance(audiences, list) else [audiences]
        if self.audience not in audiences:
            log.warning("push refused: audience %s, expected %s", claims.get("aud"), self.audience)
            return "forbidden: wrong audience", 403
        if claims.get("email") != self.service_account or claims.get("email_verified") is not True:
            log.warning("push refused: account %s (verified: %s), expected %s", claims.get("email"),
                        claims.get("email_verified"), self.service_account)
            return "forbidden: wrong service account", 403
        return None

    def _claims(self, token: str) -> Mapping[str, Any]:
        _header, claims, signature = split_token(token)
        if signature == SIGNATURE_REMOVED:
            # Cloud Run's invoker check verified the signature before removing it. Only Cloud Run can have put
            # the marker on a request that reaches the container, because deploy keeps that check on.
            check_time_and_issuer(claims, self.now())
            return claims
        # Signed: it did not come through the invoker check (e.g. with invokerIamDisabled), so verify it whole.
        if self.verifier is None:
            self.verifier = google_oidc_verifier()
        return self.verifier(token)

    def _announce_off(self, service: str) -> None:
        if self._announced:
            return
        with self._lock:
            if not self._announced:
                self._announced = True
                log.warning("%spush authentication is OFF ($%s is not 'oidc'): local mode, every push is accepted",
                            f"{service}: " if service else "", ENV_MODE)
