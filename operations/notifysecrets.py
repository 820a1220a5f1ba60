"""Inline webhook URLs in a job or fleet file, stored in Secret Manager before anything is published.

A Slack, Discord or Google Chat incoming-webhook URL lets anyone who holds it post to the channel, so tpuq never
keeps one in Firestore or in a message a service stores. A file may still give `url:` for convenience:
`tpuq submit` and `tpuq fleet apply` put each URL in a secret of the project (`tpuq-notify-<hash>`, the same URL
always the same secret), let the janitor's account read it (it sends the notifications), and publish or store the
destination with `secret:` instead. The user's own credentials do this: creating a secret needs
secretmanager.secrets.create and secretmanager.versions.add, and the grant secretmanager.secrets.setIamPolicy
(roles/secretmanager.admin has all three; a project owner has them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from tpuq.contracts.notify import SENDER_ACCOUNT_ID, Destination, format_for_url
from tpuq.runtime.secretmanager import SecretNotFound

SECRET_PREFIX = "tpuq-notify-"
SECRET_LABELS = {"tpuq": "notify"}  # tells what tpuq created from the console's secret list


class SecretStore(Protocol):  # tpuq.runtime.secretmanager.SecretManager
    def access(self, secret: str) -> str: ...
    def put(self, secret_id: str, value: str, labels: dict[str, str] | None = None) -> str: ...
    def grant_accessor(self, secret_id: str, member: str) -> None: ...


def secret_id_for(url: str) -> str:
    """The secret an inline URL is kept in: derived from the URL, so a file submitted twice adds no secret."""
    return SECRET_PREFIX + hashlib.sha256(url.encode()).hexdigest()[:20]


def sender_member(project: str) -> str:
    return f"serviceAccount:{SENDER_ACCOUNT_ID}@{project}.iam.gserviceaccount.com"


def store_inline_urls(destinations: Sequence[Destination] | None, secrets: SecretStore,
                      project: str) -> list[Destination] | None:
    """`destinations` with every `url:` replaced by the secret that now holds it (`format` fixed from the URL's
    host when unset). A URL already stored under its secret is not stored again."""
    if destinations is None:
        return None
    out: list[Destination] = []
    for d in destinations:
        if d.url is None:
            out.append(d)
            continue
        secret_id = secret_id_for(d.url)
        try:
            stored = secrets.access(secret_id)
        except SecretNotFound:
            stored = None
        if stored != d.url:
            secrets.put(secret_id, d.url, labels=SECRET_LABELS)
            secrets.grant_accessor(secret_id, sender_member(project))
        out.append(d.model_copy(update={"secret": secret_id, "url": None, "format": d.format or format_for_url(d.url)}))
    return out


def has_inline_urls(destinations: Sequence[Destination] | None) -> bool:
    return any(d.url is not None for d in destinations or [])
