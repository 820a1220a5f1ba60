"""The fake's other Google APIs: Cloud Quotas (TPU quota by zone and region), Cloud Billing and Compute Engine's
firewalls and subnetworks (read only), on their own URL.

Served by a second listening server of `FakeTpuServer` (`google_apis_url`), as cloudquotas.googleapis.com and
cloudbilling.googleapis.com are other hosts than tpu.googleapis.com. Both answer from the same world as the TPU
API: the scenario's quota and its billing state (with `/_fake/billing` overrides), so what the pre-check reads is
what the TPU API enforces.

- Cloud Quotas, `v1` (client libraries, REST) and `v1beta` (`gcloud beta quotas`), the same shape:
  `GET /{v}/projects/P/locations/global/services/tpu.googleapis.com/quotaInfos/ID` → a QuotaInfo;
  `GET /{v}/projects/P/locations/global/services/tpu.googleapis.com/quotaInfos` → `{quotaInfos: [...]}`.
  Values are in the quota's unit, which is the unit the family's type names count in: TensorCores for v2, v3, v4
  and v5p (2 per chip), chips for v5e and v6e. `details.value` is an int64, so a JSON string, and a zero is
  left out (`details: {}`), as proto3 JSON does; `-1` (a scenario's -1) is unlimited. Each family has a per-zone
  ID (zone entries, then a default) and a per-region ID (`region: R` entries from the scenario's `region_quota`,
  no default); v5e's serving IDs report v5e's one quota (`tpuq_dev.capacitymodel.render.quota_ids`).
- Cloud Billing, `v1`: `GET /v1/projects/P/billingInfo` → `{name, projectId, billingAccountName,
  billingEnabled}`; `billingEnabled` and the account are left out when billing is off (proto3 JSON).
- Compute Engine `v1`, firewalls read only (what `tpuq ssh` checks before tunnelling through IAP):
  `GET /compute/v1/projects/P/global/firewalls` → a FirewallList `{kind, id, selfLink, items, nextPageToken}`
  (`maxResults`, `pageToken`; `items` left out when there is none, as Compute Engine does), and
  `GET .../firewalls/NAME` → one Firewall. The rules are the scenario's `network.firewalls`, or what
  `POST /_fake/firewalls {"project", "firewalls"}` set for a project. Every write is refused (405): tpuq never
  changes a firewall, and the call log shows any attempt.
- Compute Engine `v1`, subnetworks read only (what `tpuq deploy` checks in every region of the fleet):
  `GET /compute/v1/projects/P/regions/R/subnetworks` → a SubnetworkList and `GET .../subnetworks/NAME` → one
  Subnetwork, from the world's layout (tpuq_dev.capacitymodel.subnets: the scenario's `network.auto_mode_networks` and
  `network.subnetworks`, or what `POST /_fake/subnetworks {"project", "auto_mode_networks", "subnetworks",
  "permission_denied"}` set for a project), the same one the TPU API's create enforces. Writes are refused (405).
- Secret Manager `v1` (tpuq_dev.faketpu.secretmanager): secrets, versions, access, IAM policies.
"""

from __future__ import annotations

import json
import re
import threading
import zlib

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from tpuq_dev.capacitymodel.clock import rfc3339
from tpuq_dev.capacitymodel.scenario import FirewallRule
from tpuq_dev.capacitymodel.subnets import Subnetwork

from .api import CallLog, add_log_routes, record_call
from .secretmanager import FakeSecretStore, add_secret_manager_routes
from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.model import FakeTpuWorld
from tpuq_dev.capacitymodel.render import TPU_SERVICE, quota_ids, render_billing_info, render_quota_info

QUOTA_VERSIONS = ("v1", "v1beta")


def _json(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


COMPUTE_URL = "https://www.googleapis.com/compute/v1/"  # the prefix of Compute Engine's selfLinks
# Parameters every Google API takes (gcloud sends alt=json); the fake answers JSON whatever they say.
SYSTEM_PARAMETERS = {"alt", "prettyPrint", "fields", "key", "quotaUser", "$alt", "$fields", "$prettyPrint"}
FIREWALL_PAGE_SIZE = 500  # compute v1 list methods: maxResults defaults to 500 (and at most 500)


def render_firewall(world: FakeTpuWorld, project: str, rule: FirewallRule) -> dict:
    """A Firewall as compute v1 returns it: the defaults filled in, the network as a URL, empty lists left out."""
    data = rule.model_dump(exclude_none=True)
    network = data.pop("network")
    if "/" not in network:
        network = f"{COMPUTE_URL}projects/{project}/global/networks/{network}"
    out = {
        "kind": "compute#firewall",
        "id": str(zlib.crc32(f"{project}/{rule.name}".encode()) * 7919),
        "creationTimestamp": rfc3339(world.clock.wall(0.0)),
        "selfLink": f"{COMPUTE_URL}projects/{project}/global/firewalls/{rule.name}",
        "network": network,
        "logConfig": {"enable": False},
    }
    for key, value in data.items():
        if key in ("allowed", "denied"):
            value = [{k: v for k, v in entry.items() if v != []} for entry in value]
        if value != []:
            out[key] = value
    return out


def render_subnetwork(world: FakeTpuWorld, project: str, subnet: Subnetwork) -> dict:
    """A Subnetwork as compute v1 returns it (the output fields of its discovery document that tpuq could read)."""
    region_url = f"{COMPUTE_URL}projects/{project}/regions/{subnet.region}"
    first = subnet.ipCidrRange.split("/")[0].rsplit(".", 1)[0]
    return {
        "kind": "compute#subnetwork",
        "id": str(zlib.crc32(f"{project}/{subnet.region}/{subnet.name}".encode()) * 7919),
        "creationTimestamp": rfc3339(world.clock.wall(0.0)),
        "name": subnet.name,
        "network": f"{COMPUTE_URL}projects/{project}/global/networks/{subnet.network}",
        "ipCidrRange": subnet.ipCidrRange,
        "gatewayAddress": f"{first}.1",
        "region": region_url,
        "selfLink": f"{region_url}/subnetworks/{subnet.name}",
        "privateIpGoogleAccess": subnet.privateIpGoogleAccess,
        "fingerprint": f"{zlib.crc32(subnet.model_dump_json().encode()):08x}",
        "stackType": "IPV4_ONLY",
        "purpose": "PRIVATE",
    }


_QUOTA_PATH = re.compile(rf"^projects/([^/]+)/locations/global/services/([^/]+)/quotaInfos(?:/([^/]+))?$")


def create_google_apis_app(world: FakeTpuWorld, call_log: CallLog) -> Flask:
    app = Flask("tpuq_dev.faketpu.googleapis")

    @app.errorhandler(ApiError)
    def _api_error(err: ApiError):
        return _json(err.to_json(), err.http_status)

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException):
        status = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(err.code or 500, "INVALID_ARGUMENT")
        return _json({"error": {"code": err.code, "message": err.description, "status": status}}, err.code or 500)

    @app.after_request
    def _record(response: Response):
        if not request.path.startswith("/_fake/"):
            record_call(call_log, world, response)
        return response

    @app.get("/<version>/<path:path>")
    def _quotas(version: str, path: str):
        if version not in QUOTA_VERSIONS:
            raise ApiError("NOT_FOUND", f"Unknown API version {version!r}")
        billing = re.fullmatch(r"projects/([^/]+)/billingInfo", path)
        if billing and version == "v1":
            return _json(billing_info(world, billing.group(1)))
        m = _QUOTA_PATH.match(path)
        if not m:
            raise ApiError("NOT_FOUND", f"The requested URL /{version}/{path} was not found.")
        project, service, qid = m.groups()
        scenario = world.scenario
        if scenario.cloud_quotas.permission_denied:
            raise ApiError("PERMISSION_DENIED", f"Permission 'cloudquotas.quotas.get' denied on resource "
                                                f"'projects/{project}' (or it may not exist).")
        if service != TPU_SERVICE:
            raise ApiError("NOT_FOUND", f"Service {service!r} is not served by this fake (only {TPU_SERVICE}).")
        known = {q: fam for q, fam in quota_ids().items() if q not in scenario.cloud_quotas.unknown_ids}
        if qid is None:
            return _json({"quotaInfos": [render_quota_info(world, project, q) for q in sorted(known)]})
        if qid not in known:
            raise ApiError("NOT_FOUND", f"QuotaInfo 'projects/{project}/locations/global/services/{service}/"
                                        f"quotaInfos/{qid}' was not found.")
        return _json(render_quota_info(world, project, qid))

    firewalls: dict[str, list[FirewallRule]] = {}  # project -> its rules, set by /_fake/firewalls
    unreadable: set[str] = set()  # projects whose rules the caller may not read (403), set by /_fake/firewalls
    lock = threading.Lock()

    def rules_of(project: str, permission: str = "compute.firewalls.list") -> list[FirewallRule]:
        with lock:
            if project in unreadable:  # Compute Engine's wording for a caller without the permission
                raise ApiError("PERMISSION_DENIED", f"Required '{permission}' permission for 'projects/{project}'")
            return list(firewalls.get(project, world.scenario.network.firewalls))

    @app.get("/compute/v1/projects/<project>/global/firewalls")
    def _firewalls_list(project: str):
        try:
            size = min(int(request.args.get("maxResults", FIREWALL_PAGE_SIZE)), FIREWALL_PAGE_SIZE)
            start = int(request.args.get("pageToken") or 0)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", "Invalid value for field 'maxResults' or 'pageToken'.") from None
        unknown = sorted(set(request.args) - {"maxResults", "pageToken"} - SYSTEM_PARAMETERS)
        if unknown:
            raise ApiError("INVALID_ARGUMENT", f"this fake does not implement {', '.join(unknown)} on firewalls.list")
        rules = sorted(rules_of(project), key=lambda r: r.name)  # Compute Engine lists by name
        body: dict = {"kind": "compute#firewallList", "id": f"projects/{project}/global/firewalls",
                      "selfLink": f"{COMPUTE_URL}projects/{project}/global/firewalls"}
        page = rules[start:start + size]
        if page:
            body["items"] = [render_firewall(world, project, r) for r in page]
        if start + size < len(rules):
            body["nextPageToken"] = str(start + size)
        return _json(body)

    @app.get("/compute/v1/projects/<project>/global/firewalls/<name>")
    def _firewalls_get(project: str, name: str):
        for rule in rules_of(project, "compute.firewalls.get"):
            if rule.name == name:
                return _json(render_firewall(world, project, rule))
        raise ApiError("NOT_FOUND", f"The resource 'projects/{project}/global/firewalls/{name}' was not found")

    @app.route("/compute/v1/projects/<project>/global/firewalls", methods=["POST"])
    @app.route("/compute/v1/projects/<project>/global/firewalls/<name>", methods=["POST", "PUT", "PATCH", "DELETE"])
    def _firewalls_write(project: str, name: str | None = None):
        return _json({"error": {"code": 405, "status": "UNIMPLEMENTED", "message": "this fake serves firewalls "
                                "read only: tpuq never changes a firewall (the owner does)"}}, 405)

    @app.get("/compute/v1/projects/<project>/regions/<region>/subnetworks")
    def _subnetworks_list(project: str, region: str):
        world.subnets.check_read(project, "compute.subnetworks.list", f"projects/{project}/regions/{region}")
        unknown = sorted(set(request.args) - SYSTEM_PARAMETERS)
        if unknown:
            raise ApiError("INVALID_ARGUMENT", f"this fake does not implement {', '.join(unknown)} on subnetworks.list")
        body: dict = {"kind": "compute#subnetworkList", "id": f"projects/{project}/regions/{region}/subnetworks",
                      "selfLink": f"{COMPUTE_URL}projects/{project}/regions/{region}/subnetworks"}
        subnets = world.subnets.in_region(project, region)
        if subnets:  # left out when there is none, as Compute Engine does
            body["items"] = [render_subnetwork(world, project, s) for s in subnets]
        return _json(body)

    @app.get("/compute/v1/projects/<project>/regions/<region>/subnetworks/<name>")
    def _subnetworks_get(project: str, region: str, name: str):
        path = f"projects/{project}/regions/{region}/subnetworks/{name}"
        world.subnets.check_read(project, "compute.subnetworks.get", path)
        subnet = world.subnets.find(project, region, name)
        if subnet is None:
            raise ApiError("NOT_FOUND", f"The resource '{path}' was not found")
        return _json(render_subnetwork(world, project, subnet))

    @app.route("/compute/v1/projects/<project>/regions/<region>/subnetworks", methods=["POST"])
    @app.route("/compute/v1/projects/<project>/regions/<region>/subnetworks/<name>",
               methods=["POST", "PUT", "PATCH", "DELETE"])
    def _subnetworks_write(project: str, region: str, name: str | None = None):
        return _json({"error": {"code": 405, "status": "UNIMPLEMENTED", "message": "this fake serves subnetworks "
                                "read only: tpuq never changes a network (the owner does)"}}, 405)

    @app.post("/_fake/subnetworks")
    def _set_subnetworks():
        body = request.get_json(force=True, silent=True) or {}
        project = body.get("project")
        if not project:
            return _json({"error": {"code": 400, "message": "project is required"}}, 400)
        subnets = body.get("subnetworks")
        world.subnets.set_layout(
            project, body.get("auto_mode_networks"),
            None if subnets is None else [Subnetwork.model_validate(s) for s in subnets],
            permission_denied=bool(body.get("permission_denied")))
        layout = world.subnets.layout(project)
        return _json({"project": project, "auto_mode_networks": list(layout.auto_mode_networks),
                      "subnetworks": [s.model_dump() for s in layout.subnetworks]})

    @app.post("/_fake/firewalls")
    def _set_firewalls():
        body = request.get_json(force=True, silent=True) or {}
        project = body.get("project")
        if not project:
            return _json({"error": {"code": 400, "message": "project is required"}}, 400)
        with lock:
            if body.get("firewalls") is None:
                firewalls.pop(project, None)
            else:
                firewalls[project] = [FirewallRule.model_validate(r) for r in body["firewalls"]]
            (unreadable.add if body.get("permission_denied") else unreadable.discard)(project)
            rules = list(firewalls.get(project, world.scenario.network.firewalls))
        return _json({"project": project, "firewalls": [render_firewall(world, project, r) for r in rules]})

    # Secret Manager (tpuq_dev.faketpu.secretmanager): webhook URLs the janitor reads, `gcloud secrets ...`.
    app.config["secrets"] = FakeSecretStore(lambda: world.clock.real_wall(world.clock.now()))
    add_secret_manager_routes(app, app.config["secrets"])
    add_log_routes(app, world, call_log)
    return app


def billing_info(world: FakeTpuWorld, project: str) -> dict:
    if world.scenario.billing.permission_denied:
        raise ApiError("PERMISSION_DENIED", "The caller does not have permission")
    return render_billing_info(world, project)
