"""Notifications: who is told what, and the message that carries one event to its destinations.

`notify:` lists destinations in the fleet file (every job, and the fleet's own events) and in a job (that job, or
its whole group). A destination names a Secret Manager secret that holds a webhook URL: the URL is a credential
(anyone with a Slack incoming-webhook URL can post to the channel), so it is never stored in Firestore, logged or
shown in full. `tpuq submit` and `tpuq fleet apply` accept an inline `url:` and store it in Secret Manager first
(`tpuq.operations.notifysecrets`); anything that reaches a service with a `url:` is refused, naming the field.

Producers (the scheduler, claimer and janitor) publish a `Notification` to the `notifications` topic after their
own commit and go on: delivery (`tpuq.janitor.notify`) is never on the path of scheduling. The event id is derived
from what happened (`event_id`), so a redelivered or repeated producer publishes the same id, and the sender
delivers each (event id, destination) once.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from tpuq.contracts.basics import StrictModel, parse_duration

# Secret Manager secret ids: "[a-zA-Z_0-9-]+", at most 255 characters (secretmanager v1 discovery, Secret name).
SECRET_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
MAX_DESTINATIONS = 10
# The account that sends notifications (the janitor's, infra/iam.yaml): it reads each destination's secret, so
# a secret tpuq stores from an inline URL is shared with it alone (tpuq.operations.notifysecrets).
SENDER_ACCOUNT_ID = "tpuq-janitor"
DEFAULT_PENDING_AFTER_SECONDS = 3600
LAST_LINES = 20  # of the failing worker, in an ended-failed notification
MAX_TEXT = 3000  # Slack's section text limit is 3,000 characters (api.slack.com/reference/block-kit/blocks#section)


class NotifyEvent(StrEnum):
    """What a destination may opt in to. Job events concern one job, or a group as a whole (its end); fleet events
    concern the fleet and go to the fleet file's destinations only."""

    succeeded = "succeeded"  # a job or group ended succeeded
    failed = "failed"  # ... failed (the reason, the failing worker's last lines; a group: the failed tasks)
    cancelled = "cancelled"  # ... cancelled (by a person, or a dependency that can never be met)
    preempted = "preempted"  # an attempt preempted, and whether and where it is retried
    pending = "pending"  # a job pending longer than the destination's `pending_after`, and why
    blocked = "blocked"  # the fleet cannot claim: billing, permission or quota
    budget = "budget"  # the daily VM-hour budget reached
    grant_end = "grant_end"  # the grant's end near
    leaked = "leaked"  # an owned resource found leaked (no job, no record)

    @property
    def is_job_event(self) -> bool:
        return self in JOB_EVENTS


JOB_EVENTS = frozenset({NotifyEvent.succeeded, NotifyEvent.failed, NotifyEvent.cancelled, NotifyEvent.preempted,
                        NotifyEvent.pending})
ENDED_EVENTS = frozenset({NotifyEvent.succeeded, NotifyEvent.failed, NotifyEvent.cancelled})
DEFAULT_EVENTS = (NotifyEvent.succeeded, NotifyEvent.failed, NotifyEvent.cancelled, NotifyEvent.blocked)


class WebhookFormat(StrEnum):
    """The body a destination is sent. None in a destination: from the URL's host when it is read."""

    slack = "slack"  # {"text": ...} (Slack incoming webhooks, api.slack.com/messaging/webhooks)
    discord = "discord"  # {"content": ...}, at most 2,000 characters (discord.com/developers/docs/resources/webhook)
    google_chat = "google_chat"  # {"text": ...} (developers.google.com/workspace/chat/quickstart/webhooks)
    json = "json"  # the Notification itself, for a receiver of one's own


def format_for_url(url: str) -> WebhookFormat:
    """The format a URL's host implies, json when it implies none."""
    host = re.sub(r"^[a-z]+://", "", url.strip().lower()).split("/", 1)[0].split(":", 1)[0]
    if host == "hooks.slack.com":
        return WebhookFormat.slack
    if host in ("discord.com", "discordapp.com") or host.endswith(".discord.com"):
        return WebhookFormat.discord
    if host == "chat.googleapis.com":
        return WebhookFormat.google_chat
    return WebhookFormat.json


def masked_url(url: str) -> str:
    """A URL as it may be shown: scheme and host, then only that there is more ("https://hooks.slack.com/…")."""
    m = re.match(r"^([a-z]+://[^/?#]+)(.*)$", url.strip(), flags=re.IGNORECASE)
    if not m:
        return "…"
    return m.group(1) + ("/…" if m.group(2) else "")


class Destination(StrictModel):
    """One place to tell: a Secret Manager secret holding a webhook URL (or, in a file the CLI reads, the URL)."""

    secret: str | None = Field(default=None, description="Secret Manager secret id (or projects/P/secrets/S) "
                               "whose latest version is the webhook URL")
    url: str | None = Field(default=None, description="Only in a file `tpuq submit` or `tpuq fleet apply` reads: "
                            "stored in Secret Manager before anything is published")
    format: WebhookFormat | None = Field(default=None, description="slack, discord, google_chat or json; unset: "
                                         "from the URL's host, else json")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(DEFAULT_EVENTS), min_length=1)
    pending_after: Annotated[int, BeforeValidator(parse_duration)] = Field(
        default=DEFAULT_PENDING_AFTER_SECONDS, description="`pending`: how long a job may wait before this says so")

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is None:
            return value
        short = value.rsplit("/secrets/", 1)[-1]
        if not SECRET_ID_RE.match(short) or (value != short and not re.match(r"^projects/[^/]+/secrets/", value)):
            raise ValueError(f"{value!r} is not a Secret Manager secret id (letters, digits, '-' and '_', at most "
                             "255) or projects/PROJECT/secrets/ID")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value.strip()):
            raise ValueError(f"{masked_url(value)!r} is not an http(s) URL")
        return value.strip() if value else value

    @model_validator(mode="after")
    def _one_place(self) -> "Destination":
        if (self.secret is None) == (self.url is None):
            raise ValueError("give exactly one of secret (a Secret Manager secret holding the webhook URL) and url")
        return self

    @property
    def label(self) -> str:
        """How a destination is named in `tpuq fleet`, logs and records: its secret, never the URL."""
        return self.secret or masked_url(self.url or "")

    def wants(self, event: NotifyEvent) -> bool:
        return event in self.events


def refuse_inline_urls(destinations: list[Destination] | None, where: str) -> None:
    """A destination that reaches a service must name a secret: the URL would be stored in Firestore."""
    for i, d in enumerate(destinations or []):
        if d.url is not None:
            raise ValueError(f"{where}[{i}].url: a webhook URL is a credential and is never stored; name a Secret "
                             "Manager secret that holds it (secret: NAME), or submit the file with `tpuq submit` / "
                             "`tpuq fleet apply`, which store the URL in Secret Manager for you")


def check_destinations(value: Any) -> Any:
    """`notify:` as a list, or one destination alone."""
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list) and len(value) > MAX_DESTINATIONS:
        raise ValueError(f"at most {MAX_DESTINATIONS} destinations")
    return value


NotifyList = Annotated[list[Destination], BeforeValidator(check_destinations)]


class Notification(StrictModel):
    """Producer -> the sender (janitor): one event, to the destinations that opted in to it."""

    event_id: str = Field(min_length=1, max_length=400)
    event: NotifyEvent
    subject: str = Field(description="The job id, group id or fleet name the event is about")
    title: str = Field(max_length=300, description="One line: 'train-3 failed (exit 4)'")
    text: str = Field(default="", max_length=MAX_TEXT, description="The reason, what happens next")
    lines: list[str] = Field(default_factory=list, max_length=LAST_LINES, description="The failing worker's last "
                             "lines (an ended-failed job)")
    fields: dict[str, str] = Field(default_factory=dict, description="Facts as name -> value: state, attempts, zone")
    destinations: list[Destination] = Field(min_length=1)
    at: datetime

    @model_validator(mode="after")
    def _secrets_only(self) -> "Notification":
        refuse_inline_urls(self.destinations, "destinations")
        return self


def event_id(event: NotifyEvent, subject: str, *parts: object) -> str:
    """The event's id, derived from what happened so that every producer and redelivery names it alike:
    ended: (event, job or 'group:'+id); preempted: + attempt; pending: + attempt; blocked: + class, zone, since;
    budget: + day; grant_end: + days left; leaked: + resource name."""
    return ":".join([event.value, subject, *(str(p) for p in parts)])


def destinations_for(event: NotifyEvent, job_notify: list[Destination] | None,
                     fleet_notify: list[Destination] | None) -> list[Destination]:
    """The destinations told of `event`: a job event goes to the job's and the fleet's destinations that opted in,
    a fleet event to the fleet's; each secret once (a job's own entry first)."""
    chosen: list[Destination] = []
    pool = [*(job_notify or []), *(fleet_notify or [])] if event.is_job_event else list(fleet_notify or [])
    for d in pool:
        if d.wants(event) and all(c.label != d.label for c in chosen):
            chosen.append(d)
    return chosen


class DestinationHealth(StrictModel):
    """notify_destinations/{store.doc_id(label)}: how one destination fares, written by the sender, read by
    `tpuq fleet` and the dashboard. `failing` from a given-up delivery until the next success."""

    label: str  # the secret's name, never the URL
    failing: bool = False
    last_error: str | None = None  # "HTTP 500", "no answer in 10s": never the URL
    last_failure_at: datetime | None = None
    last_ok_at: datetime | None = None
    failed_event_id: str | None = None  # the event a given-up delivery was for
