"""The local stack's notification stand-ins: the webhook receiver (tpuq_dev.webhooks) and the secret that names it.

`start(stack)` starts the receiver and, when the fake's Secret Manager is up (a stack with a fake TPU), stores
`tpuq-dev-webhook` = the receiver's `/hook` URL there and lets the janitor's account read it, as `tpuq fleet apply`
does for a URL it stores. So locally a job or fleet writes `notify: {secret: tpuq-dev-webhook}`, and
`tpuq dev notifications` prints what arrived. The environment (`tpuq dev env`) names both:
TPUQ_DEV_WEBHOOK_URL and TPUQ_DEV_WEBHOOK_SECRET.

`save_secret_grants(stack)` keeps the fake Secret Manager's grants in the state directory when the stack stops,
for the IAM check that runs after (tpuq_dev.iam.calls.fake_secret_grants).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import requests

from tpuq.runtime.settings import ENV_SECRETMANAGER_ENDPOINT
from tpuq_dev.devstack import processes

DEV_WEBHOOK_SECRET = "tpuq-dev-webhook"
ENV_WEBHOOK_URL = "TPUQ_DEV_WEBHOOK_URL"  # the receiver (its /_control/ API; tpuq_dev.webhooks.WebhookReceiver)
ENV_WEBHOOK_SECRET = "TPUQ_DEV_WEBHOOK_SECRET"
GRANTS_FILE = "secret-grants.json"


def start(stack: Any) -> None:
    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    rec = stack._spawn("webhooks", [sys.executable, "-m", "tpuq_dev.webhooks", "--host", "127.0.0.1", "--port",
                                    str(port)], port, url)
    processes.wait_http(url + "/", rec, timeout=processes.START_TIMEOUT, ok=lambda r: r.status_code == 200)
    stack.env[ENV_WEBHOOK_URL] = url
    endpoint = stack.env.get(ENV_SECRETMANAGER_ENDPOINT)
    if not endpoint:
        return  # no fake TPU, so no fake Secret Manager: the receiver alone
    from tpuq.runtime.secretmanager import SecretManager

    secrets = SecretManager(stack.project, endpoint)
    secrets.put(DEV_WEBHOOK_SECRET, url + "/hook", labels={"tpuq": "dev-webhook"})
    secrets.grant_accessor(DEV_WEBHOOK_SECRET, f"serviceAccount:{stack.service_account('janitor')}")
    stack.env[ENV_WEBHOOK_SECRET] = DEV_WEBHOOK_SECRET


def grants_file(state_dir: Path) -> Path:
    return Path(state_dir) / GRANTS_FILE


def save_secret_grants(stack: Any) -> None:
    """The fake Secret Manager's secrets and bindings (never payloads), while it still runs."""
    grants_file(stack.state_dir).unlink(missing_ok=True)  # an earlier stack's, in the same directory
    endpoint = (stack.env.get(ENV_SECRETMANAGER_ENDPOINT) or "").rstrip("/")
    if not endpoint:
        return
    try:
        listed = requests.get(f"{endpoint}/_fake/secrets", timeout=10).json().get("secrets") or []
    except (requests.RequestException, ValueError):
        return
    grants_file(stack.state_dir).write_text(json.dumps(listed))
