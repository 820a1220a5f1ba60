"""The secrets deploy makes itself: values no person needs to know, random bytes made when applied (the key that
signs the dashboard's sessions, tpuq.ui.sessionkey).

infra/services.yaml names them: a `secret_files` entry with `random_bytes: N`. Every other secret is the user's,
which tpuq never creates and never reads (the executor's SSH key pair, worker secrets).

The plan (pure): a secret the project lacks is created (the fleet's owner labels, automatic replication) and given a
first version; one there without an enabled version (a deploy stopped between the two) is given one. The version's
bytes are never in a plan: its request body holds a marker that is not base64, which Secret Manager would refuse
(so no known value can ever become the key), and apply swaps in `os.urandom` bytes just before sending (`filled`).
No plan, dry run, echo or log line holds the value; a dry run (`wire_request`) shows N zero bytes in its place.
Source: https://cloud.google.com/secret-manager/docs/creating-and-accessing-secrets (a secret holds versions; a value
is at most 64 KiB; creating needs roles/secretmanager.admin, which tpuq-deploy holds: infra/iam.yaml).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tpuq.deploy.infra import Infra
from tpuq.deploy.model import Action, ProjectState, Request, Target

_MARKER = re.compile(r"<(\d+) random bytes, made when applied>")


def declared(infra: Infra) -> dict[str, int]:
    """secret name -> how many random bytes its value is, for every secret deploy makes."""
    return {f.secret: f.random_bytes for s in infra.services.services for f in s.secret_files if f.random_bytes}


def marker(size: int) -> str:
    return f"<{size} random bytes, made when applied>"


def read_versionless(secretmanager, target: Target, infra: Infra, existing: set[str],
                     tolerant: Callable[[Callable[[], Any], str], Any]) -> set[str]:
    """The generated secrets that exist but hold no enabled version (one that cannot be read counts as holding one)."""
    out = set()
    for name in sorted(set(declared(infra)) & existing):
        found = tolerant(lambda: secretmanager.call("GET", f"projects/{target.project}/secrets/{name}/versions",
                                                    {"filter": "state:ENABLED", "pageSize": 1}),
                         f"versions of secret {name}")
        if found is not None and not found.get("versions"):
            out.add(name)
    return out


def actions(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    p, out = target.project, []
    for name, size in sorted(declared(infra).items()):
        if name not in (state.secrets or set()):
            out.append(Action("create", f"secret {name}", "(made by deploy; its value is random bytes made when "
                              "applied, never shown)",
                              Request("secretmanager", "POST", f"projects/{p}/secrets", {"secretId": name},
                                      {"replication": {"automatic": {}}, "labels": target.labels})))
        elif name not in state.versionless_secrets:
            continue
        out.append(Action("create", f"secret {name} version", f"({size} random bytes, made when applied)",
                          Request("secretmanager", "POST", f"projects/{p}/secrets/{name}:addVersion",
                                  body={"payload": {"data": marker(size)}})))
    return out


def _size(request: Request) -> int | None:
    data = (((request.body or {}).get("payload") or {}).get("data")) if isinstance(request.body, dict) else None
    m = _MARKER.fullmatch(data) if isinstance(data, str) else None
    return int(m.group(1)) if m else None


def filled(request: Request, random_bytes: Callable[[int], bytes]) -> Request:
    """The request apply sends: a generated secret's version with its random bytes in place of the marker."""
    size = _size(request)
    if size is None:
        return request
    data = random_bytes(size)
    if len(data) != size:
        raise ValueError(f"asked for {size} random bytes, got {len(data)}")
    return replace(request, body={"payload": {"data": base64.b64encode(data).decode()}})


def wire_request(request: Request) -> Request:
    """What a dry run shows: zero bytes stand in for the random ones, in the format Secret Manager reads."""
    return filled(request, lambda size: bytes(size))
