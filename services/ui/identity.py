"""Who is using the dashboard: the account every mutating request is made as.

- Locally (`tpuq ui`): the CLI's own user, as `tpuq.cli.identity` finds it (the application-default
  credentials' account on a project; `$TPUQ_OWNER` or the OS user on the local stack). `fixed_user`.
- Deployed (`TPUQ_UI_AUTH=cloudrun`, which `tpuq deploy` sets on the tpuq-ui service): the Google account in the
  ID token Cloud Run's invoker check verified, with the design push authentication uses (`tpuq.runtime.auth`, and
  docs/ARCHITECTURE.md, "Push authentication"): Cloud Run checks the caller's Google-signed ID token against
  `roles/run.invoker` and forwards it with its signature replaced by `SIGNATURE_REMOVED_BY_GOOGLE`, in
  `X-Serverless-Authorization` when the caller sent that header, else in `Authorization`. Such a token's claims
  are read as they are (expiry and issuer checked); any other signature did not come through that check and is
  verified whole with google-auth. The account is the `email` claim, with `email_verified`. The audience is not
  pinned: Cloud Run accepts the service's URL as well as the identity token `gcloud` mints for a person
  (`gcloud run services proxy`, `gcloud auth print-identity-token`), whose audience is gcloud's own client.

No account, no change: every mutating route answers 401 without one (tpuq.ui.app).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tpuq.runtime.auth import SIGNATURE_REMOVED, TokenVerifier, check_time_and_issuer, checked_token, google_oidc_verifier, \
    split_token

log = logging.getLogger("tpuq.ui")

ENV_UI_AUTH = "TPUQ_UI_AUTH"
UI_AUTH_CLOUD_RUN = "cloudrun"

# (request headers) -> the user's account, or None when the request carries none that verifies.
UserOf = Callable[[Mapping[str, str]], "str | None"]


def fixed_user(account: str | None) -> UserOf:
    """Locally: every request is the person who started `tpuq ui` (the server listens on 127.0.0.1 only)."""
    return lambda _headers: account


@dataclass
class CloudRunUser:
    """The account of the ID token Cloud Run's invoker check let through (see the module's docstring)."""

    verifier: TokenVerifier | None = None
    now: Callable[[], float] = time.time

    def __call__(self, headers: Mapping[str, str]) -> str | None:
        token = checked_token(headers)
        if token is None:
            return None
        try:
            _header, claims, signature = split_token(token)
            if signature == SIGNATURE_REMOVED:
                check_time_and_issuer(claims, self.now())
            else:
                if self.verifier is None:
                    self.verifier = google_oidc_verifier()
                claims = self.verifier(token)
        except Exception as e:  # noqa: BLE001 - any token that does not verify names nobody
            log.warning("ui: the request's token does not verify: %s", e)
            return None
        email = claims.get("email")
        if not isinstance(email, str) or claims.get("email_verified") is not True:
            return None
        return email
