"""Push authentication: deployed services accept only Pub/Sub's OIDC-signed pushes.

Pub/Sub signs each push with an ID token of the push service account (`tpuq-push@...`)
for an audience that `tpuq deploy` sets to the service's URL. In deployed mode
(`TPUQ_PUSH_AUTH=oidc`, with `TPUQ_PUSH_AUDIENCE` and `TPUQ_PUSH_SERVICE_ACCOUNT`)
every push request must carry `Authorization: Bearer <token>`:

- no token, or a token whose signature, expiry or issuer does not verify -> 401
- a valid token for another audience or another account, or an unverified email -> 403

Locally (`TPUQ_PUSH_AUTH` unset or `off`) nothing is checked, and the log says so once.
The verifier is injectable: tests sign tokens with a local RSA key and serve its certificate.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("tpuq.auth")

ENV_MODE = "TPUQ_PUSH_AUTH"
ENV_AUDIENCE = "TPUQ_PUSH_AUDIENCE"
ENV_SERVICE_ACCOUNT = "TPUQ_PUSH_SERVICE_ACCOUNT"
MODE_OFF = "off"
MODE_OIDC = "oidc"

# (token) -> claims, or raises ValueError / google.auth.exceptions.GoogleAuthError when the token does not verify.
TokenVerifier = Callable[[str], Mapping[str, Any]]


class PushAuthConfigError(RuntimeError):
    """Deployed mode is asked for but not fully configured: refuse everything rather than accept anything."""


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


@dataclass
class PushAuth:
    mode: str = MODE_OFF
    audience: str | None = None
    service_account: str | None = None
    verifier: TokenVerifier | None = None
    _announced: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, verifier: TokenVerifier | None = None) -> "PushAuth":
        env = os.environ if env is None else env
        mode = (env.get(ENV_MODE) or MODE_OFF).strip().lower()
        if mode not in (MODE_OFF, MODE_OIDC):
            raise PushAuthConfigError(f"${ENV_MODE} must be '{MODE_OFF}' or '{MODE_OIDC}', not {mode!r}")
        auth = cls(mode=mode, audience=env.get(ENV_AUDIENCE) or None,
                   service_account=env.get(ENV_SERVICE_ACCOUNT) or None, verifier=verifier)
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
        header = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "unauthorized: no bearer token", 401
        try:
            claims = self._verify(token.strip())
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

    def _verify(self, token: str) -> Mapping[str, Any]:
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
