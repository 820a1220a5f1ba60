"""Who is submitting: the owner the CLI records on a job (`tpuq submit`), and compares (`list --mine`, `cancel`).

On a project, the account of the application-default credentials:
- a service account (a key file, the metadata server once refreshed, impersonation): its email;
- user credentials (`gcloud auth application-default login`): the email claim of the ID token Google's token
  endpoint returns with each refresh, since gcloud asks for the `openid` and `userinfo.email` scopes (the
  access token itself is opaque); newer ADC files also carry an `account`;
- else `gcloud config get-value account`, else the OS user.

On the local stack (no credentials): `$TPUQ_OWNER` when set, else the OS user.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
from collections.abc import Callable
from typing import Any

ENV_OWNER = "TPUQ_OWNER"


def account_of(credentials: Any) -> str | None:
    """The account google.auth credentials act as, when they say (pure: reads attributes, no network)."""
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:  # the metadata server's is "default" until refreshed
        return email
    account = getattr(credentials, "account", None)
    if isinstance(account, str) and account:
        return account
    token = getattr(credentials, "id_token", None)
    if isinstance(token, str) and token.count(".") == 2:
        claims = _unverified_claims(token)
        if isinstance(claims.get("email"), str):
            return claims["email"]
    return None


def _unverified_claims(token: str) -> dict:
    """The claims of a JWT, unverified: it came from Google's token endpoint over TLS, and names the caller
    only for display and for `--mine`."""
    payload = token.split(".")[1]
    try:
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        return {}


def owner(emulated: bool, account: str | None, env: dict[str, str],
          gcloud_account: Callable[[], str | None], os_user: Callable[[], str]) -> str:
    """Who the CLI says submits (see the module's docstring for the order)."""
    if emulated:
        return env.get(ENV_OWNER) or os_user()
    return account or gcloud_account() or os_user()


def current_owner() -> str:
    """The owner for the backend the command's `cli_clients()` found."""
    from tpuq.cli import connecting

    backend = connecting.CURRENT
    emulated = backend.emulated if backend else True
    return owner(emulated, backend.account if backend else None, dict(os.environ),
                 lambda: connecting.gcloud_config_value("account"), getpass.getuser)
