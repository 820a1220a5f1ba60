"""Core (pure): who may send which request, from the method table, the role table and a project's bindings.

`check(requests, caller, project)` walks wire requests ({method, url, query, body}, as `tpuq deploy --json` prints
them and `tpuq.deploy.gcp.wire_requests` builds them) in order, as one caller, and returns a `Refusal` for each
permission the caller (or an identity a request attaches) lacks, and for each request no row describes. A request
that passes has its effect on the model, as Google would apply it: a setIamPolicy adds its bindings (deploy's
grants are read-modify-write, `tpuq.deploy.gcp._grant`, so nothing else in the policy changes), and a new bucket
gets its default policy. So an order mistake (a grant to an agent planned after what needs it) shows too.

`Project.after_grants(actions)` is the project's bindings once deploy's own grant actions applied: the plan's
`grant` actions, built by `tpuq.deploy.plan` from infra/iam.yaml (`load_infra`, `iam_resource`, `Target.member`),
so the bindings are deploy's, never a second reading of the YAML.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tpuq_dev.iam import methods, roles
from tpuq_dev.iam.methods import ACT_AS, Match, Method

KIND_LABELS = {"project": "project", "topic": "topic", "subscription": "subscription", "bucket": "bucket",
               "secret": "secret", "service_account": "service account", "run_service": "Cloud Run service"}


@dataclass(frozen=True)
class Resource:
    kind: str  # project | topic | subscription | bucket | secret | service_account | run_service
    name: str

    def __str__(self) -> str:
        return f"{KIND_LABELS.get(self.kind, self.kind)} {self.name}"


def short_name(value: str) -> str:
    """`projects/p/topics/t`, `//pubsub.googleapis.com/projects/p/topics/t` and `t` all name t."""
    return value.rstrip("/").rsplit("/", 1)[-1]


def values_at(body: Any, path: str) -> list[str]:
    """The strings at a dotted path; `name[]` walks every element of a list."""
    current = [body]
    for part in path.split("."):
        step = []
        for value in current:
            if not isinstance(value, dict):
                continue
            item = value.get(part.removesuffix("[]"))
            if part.endswith("[]"):
                step += item if isinstance(item, list) else []
            elif item is not None:
                step.append(item)
        current = step
    return [v for v in current if isinstance(v, str) and v]


def account_member(email: str) -> str:
    return email if ":" in email else f"serviceAccount:{email}"


@dataclass
class Project:
    """What IAM knows about one project: bindings on it and on its resources, and Google's agents' addresses."""

    id: str
    bindings: set[tuple[Resource, str, str]] = field(default_factory=set)  # (resource, role, member)
    storage_agent: str = ""  # Cloud Storage's service agent, which publishes a bucket's notifications

    @property
    def resource(self) -> Resource:
        return Resource("project", self.id)

    def grant(self, resource: Resource, role: str, member: str) -> None:
        self.bindings.add((resource, role, member))

    def add_bucket(self, name: str) -> None:
        for role, convenience in roles.BUCKET_DEFAULT_BINDINGS:
            self.grant(Resource("bucket", name), role, f"{convenience}:{self.id}")

    def memberships(self, member: str) -> set[str]:
        """The member, and the convenience members (projectOwner:P, ...) its basic role on the project makes it."""
        out = {member}
        for resource, role, who in self.bindings:
            if who == member and resource == self.resource and role in roles.CONVENIENCE_MEMBER:
                out.add(f"{roles.CONVENIENCE_MEMBER[role]}:{self.id}")
        return out

    def allows(self, member: str, permission: str, resource: Resource) -> bool:
        """Allow policies only: a binding on the resource or on the project (IAM inheritance) whose role holds it."""
        who = self.memberships(member)
        return any(m in who and on in (resource, self.resource) and roles.holds(role, permission)
                   for on, role, m in self.bindings)

    def after_grants(self, actions: Iterable[Any]) -> "Project":
        """This project once deploy's `grant` actions (tpuq.deploy.plan.Action) applied."""
        from tpuq.deploy.gcp import wire_requests

        for action in actions:
            if action.verb != "grant" or action.iam is None:
                continue
            get = wire_requests(action)[0]
            match = methods.find(get["method"], get["url"])
            if match is None:
                raise ValueError(f"{get['method']} {get['url']}: no row in dev/tpuq_dev/iam/methods.py")
            self.grant(self.url_resource(match), action.role, action.member)
        return self

    # ------------------------------------------------------------ resources of a request
    def url_resource(self, match: Match) -> Resource:
        for variable, kind in methods.RESOURCE_VARIABLES.items():
            if variable in match.variables:
                return Resource(kind, match.variables[variable])
        return self.resource

    def resources_for(self, match: Match, on: methods.On, body: Any) -> list[Resource]:
        if on.where == "project":
            return [self.resource]
        if on.where == "resource":
            return [self.url_resource(match)]
        if on.where.startswith("url:"):
            return [Resource(on.kind, match.variables[on.where.removeprefix("url:")])]
        return [Resource(on.kind, short_name(v)) for v in values_at(body, on.where)]


@dataclass(frozen=True)
class Refusal:
    request: str  # "POST https://..."
    method: str  # the row's method id, or "" for a request no row describes
    principal: str
    permission: str = ""
    resource: Resource | None = None
    why: str = ""
    advisory: str = ""

    def __str__(self) -> str:
        if not self.method and self.why:  # a call the model could not read (tpuq_dev.iam.calls)
            return f"{self.request}, as {self.principal.split(':', 1)[-1]}: {self.why}"
        if not self.method:
            return (f"{self.request}: no row in the IAM model's method table (dev/tpuq_dev/iam/methods.py): add one "
                    "naming the permission it needs and the page that says so")
        who = self.principal.split(":", 1)[-1]
        line = f"{self.method} ({self.request}): {who} lacks {self.permission} on {self.resource}"
        return line + (f" ({self.why})" if self.why else "") + (f" [advisory: {self.advisory}]" if self.advisory else "")


def _request_label(request: dict) -> str:
    return f"{request['method']} {request['url']}"


def refusals_of(request: dict, caller: str, project: Project) -> list[Refusal]:
    """What one request needs that the caller, or an identity it attaches, lacks."""
    match = methods.find(request["method"], request["url"])
    label = _request_label(request)
    if match is None:
        return [Refusal(label, "", caller)]
    return refusals_of_match(match, label, request.get("query"), request.get("body"), caller, project)


def refusals_of_match(match: Match, label: str, query: Any, body: Any, caller: str, project: Project,
                      advisory: str = "") -> list[Refusal]:
    """What a call of this row needs that the caller, or an identity it attaches, lacks (a REST request found by its
    URL, or a gRPC call found by its name: tpuq_dev.iam.calls). `advisory`: why a refusal would cost nothing here."""
    method = match.method
    advisory = advisory or method.advisory
    out: list[Refusal] = []

    def need(principal: str, permission: str, resource: Resource, why: str = "") -> None:
        if not project.allows(principal, permission, resource):
            out.append(Refusal(label, method.id, principal, permission, resource, why, advisory))

    for n in method.needs:
        if not methods.applies(n, query, body):
            continue
        for resource in project.resources_for(match, n.on, body):
            need(caller, n.permission, resource)
    for path in method.acts_as:
        for email in values_at(body, path):
            need(caller, ACT_AS, Resource("service_account", email),
                 f"the request attaches it at {path}: grant roles/iam.serviceAccountUser on that account")
    for identity_need in method.identity_needs:
        identities = ([project.storage_agent] if identity_need.identity == "agent:storage"
                      else values_at(body, identity_need.identity))
        for identity in identities:
            for name in values_at(body, identity_need.resource_path):
                need(account_member(identity), identity_need.permission, Resource(identity_need.kind, short_name(name)),
                     f"{identity} is the identity the request attaches ({identity_need.source})")
    return out


def _apply(method: Method, match: Match, body: Any, project: Project) -> None:
    if method.effect == "grant":
        policy = (body or {}).get("policy", body) or {}
        for binding in policy.get("bindings") or []:
            if not binding.get("condition"):
                for member in binding.get("members") or []:
                    project.grant(project.url_resource(match), binding["role"], member)
    elif method.effect == "create_bucket":
        project.add_bucket((body or {})["name"])


def check(requests: Iterable[dict], caller: str, project: Project) -> list[Refusal]:
    """Every refusal of these requests, sent in order by `caller`; what passes changes `project` as Google would."""
    out: list[Refusal] = []
    for request in requests:
        refused = refusals_of(request, caller, project)
        out += refused
        match = methods.find(request["method"], request["url"])
        if match is not None and not refused:
            _apply(match.method, match, request.get("body"), project)
    return out
