"""Who this machine says the user is, read without tpuq's own state: the account google.auth credentials act
as, and gcloud's configuration. Below both tpuq.cli.connecting (which finds the backend) and
tpuq.cli.identity (which names the owner), so neither imports the other to share them."""

from __future__ import annotations

import base64
import json
from typing import Any


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


def gcloud_config_value(key: str) -> str | None:
    """`gcloud config get-value KEY`, or None when gcloud is missing, fails or has none set."""
    import shutil
    import subprocess

    gcloud = shutil.which("gcloud")
    if not gcloud:
        return None
    try:
        done = subprocess.run([gcloud, "config", "get-value", key], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = done.stdout.strip().splitlines()[-1].strip() if done.returncode == 0 and done.stdout.strip() else ""
    return value if value and value != "(unset)" else None
