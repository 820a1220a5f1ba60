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

import getpass
import os
from collections.abc import Callable

from tpuq.cli import connecting
from tpuq.cli.accounts import gcloud_config_value

ENV_OWNER = "TPUQ_OWNER"


def owner(emulated: bool, account: str | None, env: dict[str, str],
          gcloud_account: Callable[[], str | None], os_user: Callable[[], str]) -> str:
    """Who the CLI says submits (see the module's docstring for the order)."""
    if emulated:
        return env.get(ENV_OWNER) or os_user()
    return account or gcloud_account() or os_user()


def current_owner() -> str:
    """The owner for the backend the command's `cli_clients()` found."""
    backend = connecting.CURRENT
    emulated = backend.emulated if backend else True
    return owner(emulated, backend.account if backend else None, dict(os.environ),
                 lambda: gcloud_config_value("account"), getpass.getuser)
