"""The Pub/Sub subscriptions deploy owns: the push subscriptions' bodies as deploy sends them, what of a body read
back deploy compares, and the create, update or todo each one needs (pure, no I/O; `tpuq.deploy.plan` calls it)."""

from __future__ import annotations

from typing import Any

from tpuq.contracts.topology import never_expires, subscription_body
from tpuq.deploy.infra import Infra, SubscriptionSpec
from tpuq.deploy.model import Action, ProjectState, Request, Target


def desired_subscription(target: Target, infra: Infra, spec: SubscriptionSpec) -> dict:
    """The REST body: tpuq.contracts.topology.subscription_body plus the OIDC token."""
    base_url = target.service_url(infra, spec.service)
    body = subscription_body(spec.as_topology(), target.project, base_url)
    body["pushConfig"]["oidcToken"] = {"serviceAccountEmail": target.sa_email(infra.pubsub.push_service_account),
                                       "audience": base_url}
    body["labels"] = target.labels
    return body


def owned(resource: dict | None, target: Target) -> bool:
    """Whether deploy created `resource`: it carries the fleet's owner labels (`Target.labels`)."""
    labels = (resource or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in target.labels.items())


def _seconds(duration: Any) -> float | None:
    if duration is None:
        return None
    return float(str(duration).rstrip("s"))


# pubsub v1 discovery, Subscription: an unset expirationPolicy is "a default policy with ttl of 31 days"; an unset
# messageRetentionDuration "Defaults to 7 days".
DEFAULT_SUBSCRIPTION_TTL_SECONDS = 31 * 86400
DEFAULT_MESSAGE_RETENTION_SECONDS = 7 * 86400


def expiration_ttl(body: dict) -> float | None:
    """After how many idle seconds Pub/Sub deletes this subscription; None: never.

    Pub/Sub reads a subscription back with its default policy spelled out ({ttl: "2678400s"}); the emulator leaves
    the field out unless it was sent. Both read `{}` back for one that never expires.
    """
    policy = body.get("expirationPolicy")
    return DEFAULT_SUBSCRIPTION_TTL_SECONDS if policy is None else _seconds(policy.get("ttl"))


def subscription_projection(body: dict) -> dict:
    """The fields deploy owns, normalised so that a body read back compares equal to the one sent."""
    push = body.get("pushConfig") or {}
    retry = body.get("retryPolicy") or {}
    dead = body.get("deadLetterPolicy") or {}
    return {
        "topic": body.get("topic"),
        "ackDeadlineSeconds": int(body.get("ackDeadlineSeconds") or 10),
        "pushEndpoint": push.get("pushEndpoint"),
        "oidcToken": push.get("oidcToken") or None,
        "minimumBackoff": _seconds(retry.get("minimumBackoff")),
        "maximumBackoff": _seconds(retry.get("maximumBackoff")),
        "deadLetterTopic": dead.get("deadLetterTopic"),
        "maxDeliveryAttempts": dead.get("maxDeliveryAttempts"),
        "expirationPolicy": expiration_ttl(body),
        "filter": body.get("filter") or "",
    }


# What Pub/Sub never changes on a subscription: a change means deleting it and creating it again. "After creating
# the subscription, you can't modify the filter" (https://cloud.google.com/pubsub/docs/subscription-message-filter).
IMMUTABLE = ("topic", "filter")


# What an update of a push subscription always rewrites. expirationPolicy is added only when it differs: the
# Pub/Sub emulator (0.8.20) refuses any update naming it ("Updating the expiration_policy field is currently
# unsupported in the Pub/Sub Emulator"), and tests/deploy/test_deploy_emulator.py updates subscriptions there.
SUBSCRIPTION_UPDATE_MASK = ("ackDeadlineSeconds", "pushConfig", "retryPolicy", "deadLetterPolicy")


def _subscription_summary(body: dict) -> str:
    push = body["pushConfig"]
    r, d = body["retryPolicy"], body["deadLetterPolicy"]
    return (f"→ {push['pushEndpoint']} (OIDC as {push['oidcToken']['serviceAccountEmail']}; ack "
            f"{body['ackDeadlineSeconds']}s; retry {r['minimumBackoff']}..{r['maximumBackoff']}; dead-letter after "
            f"{d['maxDeliveryAttempts']} attempts to {d['deadLetterTopic'].rsplit('/', 1)[-1]}; "
            f"{_expiry_words(body)})")


def _expiry_words(body: dict) -> str:
    ttl = expiration_ttl(body)
    return "never expires" if ttl is None else f"expires after {ttl / 86400:g} idle days"


def subscription_actions(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    p, out = target.project, []
    for spec in infra.pubsub.subscriptions:
        body = desired_subscription(target, infra, spec)
        current = state.subscriptions.get(spec.name)
        if current is None:
            out.append(Action("create", f"subscription {spec.name}", _subscription_summary(body),
                              Request("pubsub", "PUT", f"projects/{p}/subscriptions/{spec.name}", body=body)))
            continue
        have, want = subscription_projection(current), subscription_projection(body)
        if have == want:
            continue
        fixed = [k for k in IMMUTABLE if have[k] != want[k]]
        if fixed:
            path = f"projects/{p}/subscriptions/{spec.name}"
            if not owned(current, target):
                what = "; ".join(f"its {k} is {have[k] or 'none'!r}, infra/ says {want[k] or 'none'!r}" for k in fixed)
                out.append(Action("todo", f"subscription {spec.name}",
                                  f"{what}, and it does not carry tpuq's labels: a subscription's "
                                  f"{' and '.join(fixed)} cannot change; delete it and deploy again",
                                  commands=(f"gcloud pubsub subscriptions delete {spec.name} --project={p}",)))
                continue
            # Deploy's own (an older tpuq's: the ticks routed by the janitor since issue 34 moved three of them off
            # `ticks`; the runner bucket's notifications filtered per subscription since then too). Deleted and
            # created again; what it held is lost (for ticks: a minute's tick, sent again the next minute; for a
            # status object: the executor's probe finds the attempt's end within its probe interval).
            moved = "(" + "; ".join(f"its {k} was {have[k] or 'none'!r}, now {want[k] or 'none'!r}" for k in fixed) + ")"
            out.append(Action("delete", f"subscription {spec.name}", moved, Request("pubsub", "DELETE", path)))
            out.append(Action("create", f"subscription {spec.name}", _subscription_summary(body),
                              Request("pubsub", "PUT", path, body=body)))
            continue
        changed = sorted(k for k in want if have[k] != want[k])
        update = {k: v for k, v in body.items() if k not in IMMUTABLE}
        mask = [*SUBSCRIPTION_UPDATE_MASK, *(["expirationPolicy"] if "expirationPolicy" in changed else [])]
        out.append(Action("update", f"subscription {spec.name}", f"({', '.join(changed)}) " + _subscription_summary(body),
                          Request("pubsub", "PATCH", f"projects/{p}/subscriptions/{spec.name}",
                                  body={"subscription": update, "updateMask": ",".join(mask)})))
    return out


def hold_subscription_projection(body: dict) -> dict:
    """What deploy owns of a hold subscription: how long it keeps messages, and that it never expires."""
    return {"messageRetentionDuration": _seconds(body.get("messageRetentionDuration")) or DEFAULT_MESSAGE_RETENTION_SECONDS,
            "expirationPolicy": expiration_ttl(body)}


def hold_subscription_body(h, p: str, labels: dict[str, str] | None = None) -> dict:
    """The REST body of a hold subscription (a pull subscription that keeps its topic's messages): deploy creates it,
    and so does the local stack."""
    return {"topic": f"projects/{p}/topics/{h.topic}", "messageRetentionDuration": f"{h.message_retention_seconds}s",
            "expirationPolicy": never_expires(), **({"labels": labels} if labels else {})}


def hold_subscription_actions(infra: Infra, state: ProjectState, p: str, labels: dict[str, str] | None = None) -> list[Action]:
    out = []
    for h in infra.pubsub.hold_subscriptions:
        body = hold_subscription_body(h, p, labels)
        topic = body["topic"]
        detail = f"(pull; keeps {h.topic} for {h.message_retention_seconds // 86400} days for inspection; never expires)"
        current = state.subscriptions.get(h.name)
        if current is None:
            out.append(Action("create", f"subscription {h.name}", detail,
                              Request("pubsub", "PUT", f"projects/{p}/subscriptions/{h.name}", body=body)))
            continue
        if current.get("topic") != topic:
            out.append(Action("todo", f"subscription {h.name}",
                              f"is attached to {current.get('topic')}, infra/ says {topic}: a subscription cannot "
                              "change topic; delete it and deploy again",
                              commands=(f"gcloud pubsub subscriptions delete {h.name} --project={p}",)))
            continue
        have, want = hold_subscription_projection(current), hold_subscription_projection(body)
        changed = sorted(k for k in want if have[k] != want[k])  # the REST field names: the mask is exactly these
        if changed:
            out.append(Action("update", f"subscription {h.name}", f"({', '.join(changed)}) {detail}",
                              Request("pubsub", "PATCH", f"projects/{p}/subscriptions/{h.name}",
                                      body={"subscription": {k: body[k] for k in changed},
                                            "updateMask": ",".join(changed)})))
    return out
