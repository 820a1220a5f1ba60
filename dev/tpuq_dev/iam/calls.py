"""Check every Google API call the local stack's services made against the IAM model, each as its own account.

`tpuq_dev.iam.recording` writes one JSON line per call (gRPC to the emulators, HTTP to fake-gcs-server, the fake
Cloud TPU and its Cloud Quotas / Cloud Billing stand-ins), naming the service account of the process that made it.
Here (pure but for `read` and `stack_project`):
- a stand-in's URL becomes the Google URL it stands for (`google_url`, from the stack's endpoints), and a gRPC call
  is found by its full name (`methods.find_grpc`): both land on the same method table as deploy's requests;
- `refusals(calls, project, endpoints)` runs the model (`model.refusals_of_match`) on each call, as its account,
  against the project deploy's own grants make (`stack_project`: `Project.after_grants` over deploy's plan for this
  stack's fleet and buckets, as tests/deploy/test_iam_model.py builds it, plus the grants made in the fake Secret
  Manager by people and `tpuq submit`: `fake_secret_grants`), and returns each distinct refusal once,
  naming the method, the permission, the resource and the account. A call no row describes is a refusal too;
- `LIBRARY_BACKGROUND`: refusals the client library itself absorbs (marked advisory, never blocking).

The stack's fixtures call `DevStack.iam_refusals()` when they stop a stack (tests/conftest.py), so a call the
caller's roles do not allow fails the suite.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from tpuq_dev.iam import methods
from tpuq_dev.iam.model import Project, Refusal, Resource, refusals_of_match

STORAGE_URL = "https://storage.googleapis.com"
TPU_URL = "https://tpu.googleapis.com"
GRPC_RESOURCE_FIELDS = ("topic", "subscription", "database", "parent", "name")  # where each request names its target

# (row id, the thread the library makes the call on) -> why a refusal costs nothing: google-cloud-storage's bucket
# metadata cache (_bucket_metadata_cache.py, "App-centric Observability") reads the bucket on a background thread
# of its own and, on 403, caches a fallback and never asks again; no call of tpuq's waits on it.
LIBRARY_BACKGROUND = {
    ("storage.buckets.get", "_fetch_background"): "google-cloud-storage's bucket metadata cache reads the bucket in "
                                                  "the background and falls back on 403; nothing waits on it",
    ("storage.buckets.get", "_verify_existence_background"): "google-cloud-storage's bucket metadata cache checks "
                                                             "the bucket in the background; a 403 is only logged",
}

# The instance's own metadata server (google.auth asks it for credentials and the project; on Cloud Run that is how
# a service gets its account's tokens): no Google API, so no IAM permission. Any other call without a row fails.
METADATA_SERVER_HOSTS = ("169.254.169.254", "metadata.google.internal")


def is_metadata_server(call: dict) -> bool:
    from urllib.parse import urlsplit

    return call.get("kind") != "grpc" and urlsplit(str(call.get("url") or "")).hostname in METADATA_SERVER_HOSTS


def read(path: Path) -> list[dict]:
    """The recorded calls (a line still being written is left out)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def stack_endpoints(env: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Each stand-in's base URL in the stack's environment -> the Google base URLs it stands for."""
    from tpuq.runtime.settings import (ENV_CLOUDBILLING_ENDPOINT, ENV_CLOUDQUOTAS_ENDPOINT, ENV_SECRETMANAGER_ENDPOINT,
                                       ENV_TPU_ENDPOINT)
    from tpuq.capacity.cloudchecks import CLOUDBILLING_URL, CLOUDQUOTAS_URL
    from tpuq.runtime.secretmanager import SECRETMANAGER_URL

    out: dict[str, tuple[str, ...]] = {}
    stand_ins = (("STORAGE_EMULATOR_HOST", STORAGE_URL), (ENV_TPU_ENDPOINT, TPU_URL),
                 (ENV_CLOUDQUOTAS_ENDPOINT, CLOUDQUOTAS_URL), (ENV_CLOUDBILLING_ENDPOINT, CLOUDBILLING_URL),
                 (ENV_SECRETMANAGER_ENDPOINT, SECRETMANAGER_URL))
    for variable, google in stand_ins:
        local = (env.get(variable) or "").rstrip("/")
        if local:
            out[local] = (*out.get(local, ()), google.rstrip("/"))
    # The local webhook receiver (tpuq_dev.webhooks) stands for people's own webhooks: no Google API, no IAM.
    receiver = (env.get("TPUQ_DEV_WEBHOOK_URL") or "").rstrip("/")
    if receiver:
        out[receiver] = ()
    return out


def is_not_google(call: dict, endpoints: dict[str, tuple[str, ...]]) -> bool:
    """A call to a stand-in that stands for no Google API (the webhook receiver a notification is POSTed to)."""
    url = str(call.get("url") or "")
    return call.get("kind") != "grpc" and any(url.startswith(local + "/") for local, googles in endpoints.items()
                                              if not googles)


def google_url(method: str, url: str, endpoints: dict[str, tuple[str, ...]]) -> str:
    """The Google URL a stand-in's URL stands for: of the Google bases its stand-in serves, the one a row knows
    (Cloud Quotas and Cloud Billing share one stand-in); the URL as it was when no stand-in serves it."""
    for local, googles in endpoints.items():
        if googles and url.startswith(local + "/"):
            candidates = [g + url[len(local):] for g in googles]
            return next((c for c in candidates if methods.find(method, c)), candidates[0])
    return url


def _label(call: dict) -> str:
    if call.get("kind") == "grpc":
        resource = call.get("resource") or {}
        name = next((resource[f] for f in GRPC_RESOURCE_FIELDS if resource.get(f)), "")
        return f"gRPC {call.get('method')} {name}".rstrip()
    return f"{call.get('method')} {call.get('url')}"


def row_of(call: dict, endpoints: dict[str, tuple[str, ...]]) -> tuple[methods.Match | None, str]:
    """The method table's row for one recorded call (None: no row describes it), and the call as one line."""
    if call.get("kind") == "grpc":
        resource = call.get("resource") or {}
        name = next((resource[f] for f in GRPC_RESOURCE_FIELDS if resource.get(f)), "")
        return methods.find_grpc(call.get("method", ""), name), _label(call)
    url = google_url(call.get("method", ""), call.get("url", ""), endpoints)
    return methods.find(call.get("method", ""), url), f"{call.get('method')} {url}"


def call_refusals(call: dict, project: Project, endpoints: dict[str, tuple[str, ...]]) -> list[Refusal]:
    """What one recorded call needs that its account lacks (a call no row describes, or unreadable: a refusal)."""
    caller = f"serviceAccount:{call.get('account')}"
    if is_metadata_server(call) or is_not_google(call, endpoints):
        return []
    if call.get("error"):
        return [Refusal(_label(call), "", caller, why=f"the recorder could not read the call ({call['error']})")]
    match, label = row_of(call, endpoints)
    query = call.get("query") or {}
    if match is None:
        return [Refusal(label, "", caller)]
    thread = str(call.get("thread") or "")
    advisory = next((why for (row, suffix), why in LIBRARY_BACKGROUND.items()
                     if row == match.method.id and thread.endswith(f"({suffix})")), "")
    if "body_left_out" in call and (match.method.acts_as or match.method.identity_needs
                                    or any(n.when or n.on.where not in ("resource", "project")
                                           for n in match.method.needs)):
        return [Refusal(label, "", caller, why=f"{match.method.id} reads the body, which was too large to record")]
    return refusals_of_match(match, label, query, call.get("body"), caller, project, advisory)


def refusals(calls: Iterable[dict], project: Project, endpoints: dict[str, tuple[str, ...]]) -> list[Refusal]:
    """Each distinct refusal of these calls once (the same method, permission, resource and account: one line)."""
    seen: dict[tuple, Refusal] = {}
    project = copy.copy(project)  # the same bindings, each answer kept: thousands of calls ask the same few questions
    project.allows = lru_cache(maxsize=None)(project.allows)
    for call in calls:
        for refusal in call_refusals(call, project, endpoints):
            key = ((refusal.method, refusal.principal, refusal.permission, refusal.resource, refusal.advisory)
                   if refusal.method else (refusal.request, refusal.principal))
            seen.setdefault(key, refusal)
    return list(seen.values())


def blocking(found: Iterable[Refusal]) -> list[Refusal]:
    return [r for r in found if not r.advisory]


def methods_by_account(calls: Iterable[dict], endpoints: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """Each account's methods, by row id ("" for a call no row describes)."""
    out: dict[str, set[str]] = {}
    for call in calls:
        match, _ = row_of(call, endpoints)
        out.setdefault(call.get("account", ""), set()).add(match.method.id if match else "")
    return out


def stack_project(stack: Any) -> Project:
    """The project as a first deploy of this stack's fleet leaves it: deploy's own grant actions (tpuq.deploy.plan,
    from infra/iam.yaml), with the stack's runner bucket as the fleet's runner_bucket and its other buckets as the
    fleet's job_buckets (the buckets its jobs list, which a real fleet file names)."""
    from dataclasses import replace

    from tpuq.deploy.infra import load_infra
    from tpuq.deploy.plan import ProjectState, plan
    from tpuq.contracts.fleet import FleetFile

    target, _ = stack.deployment()
    job_buckets = [f"gs://{b}" for b in stack.buckets if b != stack.runner_bucket]
    fleet = FleetFile.model_validate({**target.fleet.model_dump(), "runner_bucket": f"gs://{stack.runner_bucket}",
                                      "job_buckets": job_buckets})
    target = replace(target, fleet=fleet)
    infra = load_infra(target.variables())
    project = Project(target.project, storage_agent=target.agent_email("storage")).after_grants(
        plan(target, infra, ProjectState()))
    for secret, role, member in fake_secret_grants(stack):
        project.grant(Resource("secret", secret), role, member)
    return project


def fake_secret_grants(stack: Any) -> list[tuple[str, str, str]]:
    """(secret, role, member) of every grant made in the fake Secret Manager: not deploy's, but those a person or
    `tpuq submit` / `tpuq fleet apply` made on a secret they stored (the stack's own `tpuq-dev-webhook` too)."""
    from tpuq_dev.devstack import notifystack

    saved = notifystack.grants_file(stack.state_dir)  # kept by DevStack.down (the check runs after it)
    if not saved.exists():
        notifystack.save_secret_grants(stack)
    try:
        listed = json.loads(saved.read_text())
    except (OSError, ValueError):
        return []  # no fake Secret Manager: no grant is known, and a call that needed one is refused
    return [(s["name"].rsplit("/", 1)[-1], b["role"], m) for s in listed for b in s.get("bindings") or []
            for m in b.get("members") or []]
