"""The side effects of `tpuq deploy`: small REST adapters, reading the project's state, and apply().

Every adapter is a `RestApi`: a versioned base URL and a session (google-auth's AuthorizedSession for a
real project; a plain requests.Session for an emulator). Tests point the Pub/Sub one at the emulator and
replace the others with recorders.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from tpuq.deploy import generated_secrets, job_buckets, network
from tpuq.deploy.infra import Infra
from tpuq.capacity.quota import parse_billing_info
from tpuq.deploy.model import Action, IamResource, NetworkFacts, ProjectState, Request, Target
from tpuq.deploy.plan import NETWORK, iam_resource, large_slice_regions

BASE_URLS = {
    "serviceusage": "https://serviceusage.googleapis.com/v1/",
    # generateServiceIdentity (a service agent on demand) exists in v1beta1 only.
    "serviceusage_v1beta1": "https://serviceusage.googleapis.com/v1beta1/",
    "crm": "https://cloudresourcemanager.googleapis.com/v1/",
    "iam": "https://iam.googleapis.com/v1/",
    "pubsub": "https://pubsub.googleapis.com/v1/",
    "storage": "https://storage.googleapis.com/storage/v1/",
    "run": "https://run.googleapis.com/v2/",
    "scheduler": "https://cloudscheduler.googleapis.com/v1/",
    "firestore": "https://firestore.googleapis.com/v1/",
    "artifactregistry": "https://artifactregistry.googleapis.com/v1/",
    "secretmanager": "https://secretmanager.googleapis.com/v1/",
    "compute": "https://compute.googleapis.com/compute/v1/",
    "cloudbuild": "https://cloudbuild.googleapis.com/v1/",
    "cloudbilling": "https://cloudbilling.googleapis.com/v1/",  # read only: is billing on (Cloud Run needs it too)
}
READ_ONLY_APIS = {"compute", "cloudbilling"}  # network and billing settings are the owner's: tpuq only reads them


# An API enabled moments ago (`services:enable`, whose operation is done) can still refuse its first calls for a few
# minutes, 403 with google.rpc.ErrorInfo reason SERVICE_DISABLED in domain googleapis.com: "... API has not been
# used in project N before or it is disabled. ... If you enabled this API recently, wait a few minutes for the
# action to propagate to our systems and retry." (production-facts.md, "API enablement propagates"). The JSON APIs
# of the older style (Cloud Storage's: https://cloud.google.com/storage/docs/json_api/v1/status-codes) say the same
# in `errors[]` as reason accessNotConfigured, domain usageLimits. Retried with backoff, like IAM propagation
# (https://cloud.google.com/service-usage/docs/troubleshooting: "retry with exponential intervals").
SERVICE_DISABLED = frozenset({("googleapis.com", "SERVICE_DISABLED"), ("usageLimits", "accessNotConfigured")})


def error_reasons(body: Any) -> frozenset[tuple[str, str]]:
    """The (domain, reason) pairs of a Google error body: ErrorInfo entries of `error.details` (AIP-193) and the
    entries of `error.errors` (the older JSON APIs)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return frozenset()
    entries = [d for d in error.get("details") or [] if isinstance(d, dict)
               and str(d.get("@type", "")).endswith("google.rpc.ErrorInfo")]
    entries += [e for e in error.get("errors") or [] if isinstance(e, dict)]
    return frozenset((str(e.get("domain", "")), str(e.get("reason", ""))) for e in entries if e.get("reason"))


class ApiError(RuntimeError):
    def __init__(self, api: str, method: str, path: str, status: int, message: str,
                 reasons: frozenset[tuple[str, str]] = frozenset()):
        super().__init__(f"{api} {method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.reasons = reasons  # (domain, reason) pairs: error_reasons

    @property
    def service_disabled(self) -> bool:
        """The API is not enabled in the project, or was enabled moments ago and does not know it yet."""
        return self.status == 403 and bool(self.reasons & SERVICE_DISABLED)


class NetworkChangeRefused(RuntimeError):
    """A request that would change network (or billing) settings: tpuq never sends one."""


class RestApi:
    def __init__(self, name: str, base_url: str, session, sleep: Callable[[float], None] = time.sleep,
                 operation_timeout: float = 600.0):
        self.name = name
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.session = session
        self.sleep = sleep
        self.operation_timeout = operation_timeout

    def call(self, method: str, path: str, params: dict | None = None, body: Any = None) -> dict:
        if self.name in READ_ONLY_APIS and method != "GET":
            raise NetworkChangeRefused(f"refused {method} {path}: tpuq never changes {self.name} settings")
        r = self.session.request(method, self.base_url + path, params=params, json=body, timeout=60)
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = None
            error = body.get("error") if isinstance(body, dict) else None
            message = (error.get("message") if isinstance(error, dict) else None) or r.text
            raise ApiError(self.name, method, path, r.status_code, str(message)[:500], error_reasons(body))
        return r.json() if r.content else {}

    def get_or_none(self, path: str, params: dict | None = None) -> dict | None:
        try:
            return self.call("GET", path, params)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_all(self, path: str, key: str, params: dict | None = None) -> list[dict]:
        items, token = [], None
        while True:
            page = self.call("GET", path, {**(params or {}), **({"pageToken": token} if token else {})})
            items += page.get(key) or []
            token = page.get("nextPageToken")
            if not token:
                return items

    def send(self, request: Request) -> dict:
        result = self.call(request.method, request.path, request.params, request.body)
        return self._wait(result)

    def _wait(self, result: dict) -> dict:
        """Long-running operations (Run, Firestore, Service Usage, Artifact Registry) are polled until done."""
        name = result.get("name", "")
        if not (name.startswith("operations/") or "/operations/" in name):
            return result
        deadline = time.monotonic() + self.operation_timeout
        delay = 1.0
        while not result.get("done"):
            if time.monotonic() > deadline:
                raise ApiError(self.name, "GET", name, 504, "operation did not finish in time")
            self.sleep(delay)
            delay = min(delay * 1.5, 10.0)
            result = self.call("GET", name)
        if result.get("error"):
            raise ApiError(self.name, "operation", name, 500, str(result["error"].get("message")))
        return result


class FirestoreFleetStore:
    """The `fleetstore` adapter: the fleet file in Firestore fleets/{name}, as `tpuq fleet apply` stores it."""

    def __init__(self, project: str, client=None):
        self.project = project
        self._client = client

    @property
    def client(self):
        if self._client is None:
            from google.cloud import firestore

            self._client = firestore.Client(project=self.project)
        return self._client

    def send(self, request: Request) -> dict:
        from datetime import datetime, timezone

        from tpuq.contracts.fleet import FleetFile
        from tpuq.runtime.fleetstore import save_fleet

        return {"version": save_fleet(self.client, FleetFile.model_validate(request.body), datetime.now(timezone.utc))}

    def stored_version(self, name: str) -> str | None:
        snap = self.client.collection("fleets").document(name).get()
        return (snap.to_dict() or {}).get("version") if snap.exists else None


def project_adapters(project: str, credentials=None) -> dict[str, Any]:
    """Adapters for a real project, authorised with Application Default Credentials."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    if credentials is None:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = AuthorizedSession(credentials)
    adapters: dict[str, Any] = {name: RestApi(name, url, session) for name, url in BASE_URLS.items()}
    adapters["fleetstore"] = FirestoreFleetStore(project)
    return adapters


def emulator_pubsub(host: str) -> RestApi:
    return RestApi("pubsub", f"http://{host}/v1/", requests.Session())


# ------------------------------------------------------------ reading state
def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _tolerant(read: Callable[[], Any], default: Any, notes: list[str], what: str,
              refused: Callable[[ApiError], None] | None = None) -> Any:
    """An API not enabled yet (403) or a resource not there (404) reads as empty; `refused(error)` hears of each."""
    try:
        return read()
    except ApiError as e:
        if e.status in (403, 404, 501):  # 501: an emulator without that method (Pub/Sub's has no IAM)
            notes.append(f"{what}: read as empty (HTTP {e.status})")
            if refused is not None:
                refused(e)
            return default
        raise


def _unreadable_job_bucket(state: ProjectState, key: str) -> Callable[[ApiError], None]:
    def heard(error: ApiError) -> None:
        name = job_buckets.bucket_of(key)
        if name is not None and job_buckets.policy_refused(error.status, error.service_disabled):
            state.unreadable_job_buckets.add(name)
    return heard


def read_state(adapters: Mapping[str, Any], target: Target, infra: Infra) -> tuple[ProjectState, list[str]]:
    """The project's current state, as far as it can be read, and notes on what could not be."""
    p, notes = target.project, []
    s = ProjectState(known=True)
    a = adapters
    project = _tolerant(lambda: a["crm"].call("GET", f"projects/{p}"), {}, notes, "project")
    s.project_number = project.get("projectNumber")
    s.enabled_apis = {svc["config"]["name"] for svc in _tolerant(
        lambda: a["serviceusage"].list_all(f"projects/{p}/services", "services", {"filter": "state:ENABLED",
                                                                                 "pageSize": 200}),
        [], notes, "enabled APIs")}
    s.service_account_resources = {acc["email"]: acc for acc in _tolerant(
        lambda: a["iam"].list_all(f"projects/{p}/serviceAccounts", "accounts"), [], notes, "service accounts")}
    s.service_accounts = set(s.service_account_resources)
    s.topic_resources = {_short(t["name"]): t for t in _tolerant(
        lambda: a["pubsub"].list_all(f"projects/{p}/topics", "topics"), [], notes, "topics")}
    s.topics = set(s.topic_resources)
    s.subscriptions = {_short(sub["name"]): sub for sub in _tolerant(
        lambda: a["pubsub"].list_all(f"projects/{p}/subscriptions", "subscriptions"), [], notes, "subscriptions")}
    bucket = target.runner_bucket
    current_bucket = _tolerant(lambda: a["storage"].get_or_none(f"b/{bucket}"), None, notes, "runner bucket")
    if current_bucket is not None:
        s.buckets[bucket] = current_bucket
        s.notifications[bucket] = _tolerant(lambda: a["storage"].call("GET", f"b/{bucket}/notificationConfigs")
                                            .get("items", []), [], notes, "notifications")
    parent = f"projects/{p}/locations/{target.region}"
    s.artifact_repository_resources = {_short(r["name"]): r for r in _tolerant(
        lambda: a["artifactregistry"].list_all(f"{parent}/repositories", "repositories"), [], notes, "repositories")}
    s.artifact_repositories = set(s.artifact_repository_resources)
    s.run_services = {_short(svc["name"]): svc for svc in _tolerant(
        lambda: a["run"].list_all(f"{parent}/services", "services"), [], notes, "Cloud Run services")}
    s.scheduler_jobs = {_short(j["name"]): j for j in _tolerant(
        lambda: a["scheduler"].list_all(f"{parent}/jobs", "jobs"), [], notes, "scheduler jobs")}
    db = infra.firestore.database
    if _tolerant(lambda: a["firestore"].get_or_none(f"projects/{p}/databases/{db}"), None, notes, "database"):
        s.firestore_databases.add(db)
        s.firestore_indexes = _tolerant(lambda: a["firestore"].list_all(
            f"projects/{p}/databases/{db}/collectionGroups/-/indexes", "indexes"), [], notes, "indexes")
        s.stored_fleet_version = _tolerant(lambda: a["fleetstore"].stored_version(target.fleet.name), None, notes,
                                           "stored fleet") if hasattr(a["fleetstore"], "stored_version") else None
    s.secrets = {_short(x["name"]) for x in _tolerant(
        lambda: a["secretmanager"].list_all(f"projects/{p}/secrets", "secrets"), [], notes, "secrets")}
    s.versionless_secrets = generated_secrets.read_versionless(
        a["secretmanager"], target, infra, s.secrets, lambda read, what: _tolerant(read, None, notes, what))
    for key in sorted({b.resource for b in infra.iam.bindings}):
        resource = iam_resource(target, infra, key)
        policy = _tolerant(lambda: _get_policy(a[resource.api], resource), {}, notes, f"IAM policy of {resource.label}",
                           _unreadable_job_bucket(s, key))
        s.iam[key] = {(b["role"], m) for b in policy.get("bindings", []) for m in b.get("members", [])}
    build = _tolerant(lambda: a["cloudbuild"].call("GET", f"projects/{p}/locations/global/defaultServiceAccount"),
                      {}, notes, "Cloud Build's default account") if "cloudbuild" in a else {}
    s.cloud_build_account = build.get("serviceAccountEmail")
    for region in large_slice_regions(target.fleet):
        s.networks[region] = _tolerant(lambda: read_network(a["compute"], p, region, target.fleet.network,
                                                            target.fleet.subnetwork), NetworkFacts(), notes,
                                       f"network in {region}")
    if "cloudbilling" in a:
        billing = _tolerant(lambda: a["cloudbilling"].call("GET", f"projects/{p}/billingInfo"), None, notes, "billing")
        s.billing_enabled = None if billing is None else parse_billing_info(billing).enabled
    s.vpc = network.read_vpc_facts(a, target, lambda read, what: _tolerant(read, None, notes, what))
    s.missing_buckets = job_buckets.read_missing(a["storage"], target,
                                                 lambda read, what: _tolerant(read, None, notes, what))
    return s, notes


def read_bucket_objects(storage: RestApi, bucket: str) -> list[str]:
    """Every object's name (for `tpuq undeploy --purge`: a bucket is deleted only when empty)."""
    return [o["name"] for o in storage.list_all(f"b/{bucket}/o", "items", {"fields": "items(name),nextPageToken"})]


def read_network(compute: RestApi, project: str, region: str, network_name: str = NETWORK,
                 subnetwork: str = NETWORK) -> NetworkFacts:
    """Private Google Access on the subnet and a Cloud NAT that covers it: read, never written."""
    subnet = compute.get_or_none(f"projects/{project}/regions/{region}/subnetworks/{subnetwork}")
    routers = compute.call("GET", f"projects/{project}/regions/{region}/routers").get("items", [])
    nat = False
    for router in routers:
        if not router.get("network", "").endswith(f"/networks/{network_name}"):
            continue
        for n in router.get("nats") or []:
            ranges = n.get("sourceSubnetworkIpRangesToNat")
            if ranges in ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES") or any(
                    sub.get("name", "").endswith(f"/subnetworks/{subnetwork}") for sub in n.get("subnetworks") or []):
                nat = True
    return NetworkFacts(private_google_access=bool(subnet and subnet.get("privateIpGoogleAccess")), cloud_nat=nat)


def _get_policy(api: RestApi, resource: IamResource) -> dict:
    return api.send(resource.get)


# ------------------------------------------------------------------- apply
# IAM may not know a service account created moments ago for 60 s or more: a grant naming it fails with
# 400 "... does not exist" (or 404 for the account's own policy) until it does. Wait up to ~3 minutes.
PROPAGATION_FIRST_DELAY = 2.0
PROPAGATION_MAX_DELAY = 32.0
PROPAGATION_BUDGET = 180.0
# An API enabled moments ago (SERVICE_DISABLED above): Google says "wait a few minutes". Wait up to 5.
ENABLEMENT_BUDGET = 300.0


def apply(actions: list[Action], adapters: Mapping[str, Any], echo: Callable[[str], None] = print,
          sleep: Callable[[float], None] = time.sleep, random_bytes: Callable[[int], bytes] = os.urandom) -> int:
    """Send each action's request in order; stop at the first failure (ApiError says which). Returns the count.

    A delete of something already gone (404) is done: undeploy run twice, or after a partial run, goes on. A secret
    deploy makes gets its random bytes here, from `random_bytes`, and nowhere else (tpuq.deploy.generated_secrets).
    """
    sent = 0
    for action in actions:
        if not action.sends:
            continue
        if action.iam is not None:
            change = _revoke if action.verb == "revoke" else _grant
            _until_known(lambda: change(adapters[action.iam.api], action), action, sleep)
        else:
            assert action.request is not None
            request = generated_secrets.filled(action.request, random_bytes)
            try:
                _until_known(lambda: adapters[request.api].send(request), action, sleep)
            except ApiError as e:
                if not (action.verb == "delete" and e.status == 404):
                    raise
        sent += 1
        echo(f"done: {action.verb} {action.what}")
    return sent


def _names_an_account(action: Action) -> bool:
    if action.iam is not None:
        return action.iam.key.startswith("service_account:") or (action.member or "").startswith("serviceAccount:")
    return action.request is not None and ".iam.gserviceaccount.com" in json.dumps(action.request.body)


def _not_known_yet(error: ApiError, action: Action) -> bool:
    """A new service account or service agent that IAM does not know yet, or a concurrent policy change (409).

    Not only grants: a Cloud Run service that runs as a new account, or a subscription that pushes as one,
    is refused the same way until IAM knows it.
    """
    if error.status == 400 and "does not exist" in error.message.lower() and _names_an_account(action):
        return True
    if action.iam is None:
        return False
    if error.status == 404 and action.iam.key.startswith("service_account:"):
        return True
    return error.status == 409  # the policy changed between our read and write (etag): read it again


def _retry_budget(error: ApiError, action: Action) -> float:
    """How many seconds of waiting this refusal is worth: Google not knowing yet what was just made or enabled.
    0 for every other error (another 403 too): it is real, and said at once."""
    if error.service_disabled:
        return ENABLEMENT_BUDGET
    return PROPAGATION_BUDGET if _not_known_yet(error, action) else 0.0


def _until_known(write: Callable[[], Any], action: Action, sleep: Callable[[float], None]) -> Any:
    delay, waited = PROPAGATION_FIRST_DELAY, 0.0
    while True:
        try:
            return write()
        except ApiError as e:
            if waited >= _retry_budget(e, action):
                raise
        sleep(delay)
        waited += delay
        delay = min(delay * 2, PROPAGATION_MAX_DELAY)


def with_member(policy: dict, role: str, member: str) -> dict | None:
    """A copy of the policy with member in role's unconditional binding; None when it is there already."""
    policy = copy.deepcopy(policy or {})
    bindings = policy.setdefault("bindings", [])
    binding = next((b for b in bindings if b.get("role") == role and not b.get("condition")), None)
    if binding is None:
        binding = {"role": role, "members": []}
        bindings.append(binding)
    if member in binding.setdefault("members", []):
        return None
    binding["members"].append(member)
    return policy


def without_members(policy: dict, pairs: set[tuple[str, str]]) -> dict | None:
    """A copy of the policy without these (role, member) pairs (unconditional bindings only); None if none is there."""
    policy = copy.deepcopy(policy or {})
    changed = False
    kept = []
    for b in policy.get("bindings", []):
        if not b.get("condition"):
            members = [m for m in b.get("members", []) if (b.get("role"), m) not in pairs]
            changed |= len(members) != len(b.get("members", []))
            if not members:
                continue
            b = {**b, "members": members}
        kept.append(b)
    if not changed:
        return None
    policy["bindings"] = kept
    return policy


def set_policy_request(resource: IamResource, policy: dict) -> Request:
    body = {"policy": policy} if resource.wrap_policy else policy
    return Request(resource.api, resource.set_method, resource.set_path, body=body)


def _grant(api, action: Action) -> None:
    """Read-modify-write with the policy's etag: only this one binding is added; nothing else changes."""
    resource = action.iam
    assert resource is not None and action.role and action.member
    policy = with_member(api.send(resource.get) or {}, action.role, action.member)
    if policy is not None:
        api.send(set_policy_request(resource, policy))


def _revoke(api, action: Action) -> None:
    """Read-modify-write: only this one (role, member) pair goes; every other binding stays as it is."""
    resource = action.iam
    assert resource is not None and action.role and action.member
    policy = without_members(api.send(resource.get) or {}, {(action.role, action.member)})
    if policy is not None:
        api.send(set_policy_request(resource, policy))


# ------------------------------------------------------- requests as JSON
def wire_requests(action: Action) -> list[dict]:
    """The requests apply sends for this action against an empty project, as {method, url, query, body}.

    A grant is its getIamPolicy and the setIamPolicy of an empty policy plus the one binding (a revoke: of a
    policy that held only that binding, minus it); the fleet
    document (written through the Firestore client) is shown as the REST commit that stands for it.
    """
    if action.iam is not None:
        assert action.role and action.member
        held = {"bindings": [{"role": action.role, "members": [action.member]}]}
        policy = without_members(held, {(action.role, action.member)}) if action.verb == "revoke" else \
            with_member({}, action.role, action.member)
        return [_wire(action.iam.get), _wire(set_policy_request(action.iam, policy or {}))]
    if action.request is None:
        return []
    if action.request.api == "fleetstore":
        return [_wire(fleet_commit_request(action.request))]
    return [_wire(generated_secrets.wire_request(action.request))]


def _wire(request: Request) -> dict:
    return {"method": request.method, "url": BASE_URLS[request.api] + request.path,
            "query": dict(request.params or {}), "body": request.body}


def fleet_commit_request(request: Request) -> Request:
    """save_fleet's document set, as the Firestore REST commit it amounts to (an update with no mask)."""
    from tpuq.contracts import store
    from tpuq.contracts.fleet import FleetFile

    project = request.body["project"]
    name = f"projects/{project}/databases/(default)/documents/{store.FLEETS}/{request.path}"
    fields = {"name": request.path, "fleet": request.body, "version": FleetFile.model_validate(request.body).version}
    document = {"name": name, "fields": {**{k: _firestore_value(v) for k, v in fields.items()},
                                         "updated_at": {"timestampValue": "1970-01-01T00:00:00Z"}}}  # now, at apply
    return Request("firestore", "POST", f"projects/{project}/databases/(default)/documents:commit",
                   body={"writes": [{"update": document}]})


def _firestore_value(value: Any) -> dict:
    if value is None:
        return {"nullValue": "NULL_VALUE"}
    if isinstance(value, bool):
        return {"booleanValue": value}
    if isinstance(value, int):
        return {"integerValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, dict):
        return {"mapValue": {"fields": {k: _firestore_value(v) for k, v in value.items()}}}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_firestore_value(v) for v in value]}}
    raise TypeError(f"no Firestore value for {type(value).__name__}")
