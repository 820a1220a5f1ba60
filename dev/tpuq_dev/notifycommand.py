"""`tpuq dev notifications`: what the local stack's webhook receiver (tpuq_dev.webhooks) got, oldest first.

One line per POST: time, path, event, title. A table on a terminal, tab-separated when piped (`cut -f`), every
field with `--json`. The event and title are read from the body as each format carries them: the json format's
`event` and `title`; Slack's and Google Chat's `text`, Discord's `content` (their first line is the title).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from tpuq.cli.console import CliError, out

NOTIFICATIONS_TABLE = ("time", "path", "event", "title")


def notification_row(entry: dict) -> tuple[str, str, str, str]:
    """One received POST as (time, path, event, title) (pure)."""
    body = entry.get("body")
    event, title = "", ""
    if isinstance(body, dict):
        text = body.get("title") or body.get("text") or body.get("content") or ""
        title = str(text).strip().splitlines()[0] if str(text).strip() else ""
        event = str(body.get("event") or "")
    elif body is not None:
        title = str(body)[:80]
    return (str(entry.get("time") or ""), str(entry.get("path") or ""), event, title)


def dev_notifications(path: Optional[str] = typer.Option(None, help="Only what reached this path (/hook/...)"),
                      as_json: bool = typer.Option(False, "--json", help="Every field of every POST, as JSON"),
                      state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Print what the local stack's webhook receiver got (`notify: {secret: tpuq-dev-webhook}`)."""
    import requests

    from tpuq.operations.stackenv import load_env
    from tpuq_dev.devstack.notifystack import ENV_WEBHOOK_URL
    from tpuq_dev.webhooks import WebhookReceiver

    url = load_env(state_dir).get(ENV_WEBHOOK_URL)
    if not url:
        raise CliError("no local webhook receiver: start the local stack with `tpuq dev up`")
    try:
        received = WebhookReceiver(url).received(path)
    except requests.RequestException as e:
        raise CliError(f"the webhook receiver at {url} did not answer ({type(e).__name__}): is the stack up?") from None
    if as_json:
        print(json.dumps(received, indent=2))
        return
    rows = [notification_row(r) for r in received]
    from tpuq.cli.views import tab_separated

    if not out.is_terminal:
        print(tab_separated(NOTIFICATIONS_TABLE, rows))
        return
    if not rows:
        out.print("nothing received yet (a destination `secret: tpuq-dev-webhook` sends here)")
        return
    from rich.table import Table

    table = Table()
    for name in NOTIFICATIONS_TABLE:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)
