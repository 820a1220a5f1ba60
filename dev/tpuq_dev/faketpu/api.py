"""The HTTP face of the fake Cloud TPU: REST routes on /v2/ and /v2alpha1/, control routes on /_fake/.

Thin on purpose: parse the request, call `FakeTpuWorld`, render JSON the way the
real API does (camelCase, enum names, RFC 3339 times, `@type` on operation
payloads, `{error:{code,message,status,details}}` bodies). Every call outside
/_fake/ is recorded in the call log that tests use as a witness.
"""

from __future__ import annotations

import json
import re
import threading
from urllib.parse import unquote
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from tpuq_dev.capacitymodel.clock import rfc3339
from tpuq.contracts.documents import MaintenanceType, SymptomType, TpuHealth
from .faults import FaultLayer, add_fault_layer
from tpuq_dev.capacitymodel.errors import ERROR_CLASSES, HTTP_STATUS, ApiError, invalid
from tpuq_dev.capacitymodel.render import render_node, render_operation, render_queued_resource
from tpuq_dev.capacitymodel.model import ApiCallFault, FakeTpuWorld, NodeState

API_VERSIONS = ("v2", "v2alpha1")


class CallLog:
    """Every API call made to the fake: method, path, query, body, time, status."""

    def __init__(self) -> None:
        self._calls: list[dict] = []
        self._lock = threading.Lock()

    def append(self, call: dict) -> None:
        with self._lock:
            self._calls.append(call)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self._calls)

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()


# -- routing ---------------------------------------------------------------------------------

_LOC = r"projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("GET", re.compile(rf"^{_LOC}/queuedResources$"), "list_queued_resources"),
    ("POST", re.compile(rf"^{_LOC}/queuedResources$"), "create_queued_resource"),
    ("GET", re.compile(rf"^{_LOC}/queuedResources/(?P<id>[^/:]+)$"), "get_queued_resource"),
    ("DELETE", re.compile(rf"^{_LOC}/queuedResources/(?P<id>[^/:]+)$"), "delete_queued_resource"),
    ("POST", re.compile(rf"^{_LOC}/queuedResources/(?P<id>[^/:]+):reset$"), "reset_queued_resource"),
    ("GET", re.compile(rf"^{_LOC}/nodes$"), "list_nodes"),
    ("GET", re.compile(rf"^{_LOC}/nodes/(?P<id>[^/:]+)$"), "get_node"),
    ("DELETE", re.compile(rf"^{_LOC}/nodes/(?P<id>[^/:]+)$"), "delete_node"),
    ("POST", re.compile(rf"^{_LOC}/nodes/(?P<id>[^/:]+):getGuestAttributes$"), "get_guest_attributes"),
    ("GET", re.compile(rf"^{_LOC}/operations/(?P<id>[^/:]+)$"), "get_operation"),
]


def _json_response(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def _request_json() -> dict:
    raw = request.get_data(cache=True)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise invalid(f"Invalid JSON payload received. {e}") from None
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received. The body must be a JSON object.")
    return body


def _page_size() -> int:
    value = request.args.get("pageSize", "0")
    try:
        return int(value)
    except ValueError:
        raise invalid(f"Invalid value at 'page_size' (TYPE_INT32), \"{value}\"", "page_size") from None


def _member(enum, value, field_name: str):
    try:
        return enum(value)
    except ValueError:
        raise invalid(f"unknown {field_name} {value!r}; expected one of {', '.join(m.value for m in enum)}",
                      field_name) from None


def _flag(name: str) -> bool:
    return request.args.get(name, "").lower() in ("true", "1")


class RestApi:
    """Handlers of the Cloud TPU REST surface; `after_change` lets the server react (stop hosts)."""

    def __init__(self, world: FakeTpuWorld, after_change: Callable[[], None] = lambda: None):
        self.world = world
        self.after_change = after_change

    def dispatch(self, version: str, path: str) -> Response:
        if version not in API_VERSIONS:
            raise ApiError("NOT_FOUND", f"The requested URL /{version}/{path} was not found on this server.")
        allowed = False
        for method, pattern, handler in _ROUTES:
            match = pattern.match(path)
            if not match:
                continue
            allowed = True
            if method == request.method:
                params = match.groupdict()
                self.world.check_call(params["project"], params["zone"], request.method, request.path)
                try:
                    return getattr(self, handler)(version, **params)
                finally:
                    self.after_change()
        if allowed:
            raise ApiError("UNIMPLEMENTED", f"Method {request.method} is not implemented for /{version}/{path}")
        raise ApiError("NOT_FOUND", f"The requested URL /{version}/{path} was not found on this server.")

    def create_queued_resource(self, version, project, zone):
        op = self.world.create_queued_resource(
            project, zone, request.args.get("queuedResourceId"), _request_json(), request.args.get("requestId"),
            api_version=version,
        )
        return _json_response(render_operation(self.world, op, version))

    def get_queued_resource(self, version, project, zone, id):
        return _json_response(render_queued_resource(self.world, self.world.get_queued_resource(project, zone, id),
                                                     version))

    def list_queued_resources(self, version, project, zone):
        items, token = self.world.list_queued_resources(
            project, zone, _page_size(), request.args.get("pageToken", "")
        )
        body: dict[str, Any] = {"queuedResources": [render_queued_resource(self.world, q, version) for q in items]}
        if token:
            body["nextPageToken"] = token
        return _json_response(body)

    def delete_queued_resource(self, version, project, zone, id):
        op = self.world.delete_queued_resource(project, zone, id, force=_flag("force"), api_version=version)
        return _json_response(render_operation(self.world, op, version))

    def reset_queued_resource(self, version, project, zone, id):
        _request_json()  # must be JSON (the client sends {})
        op = self.world.reset_queued_resource(project, zone, id, api_version=version)
        return _json_response(render_operation(self.world, op, version))

    def get_node(self, version, project, zone, id):
        return _json_response(render_node(self.world, self.world.get_node(project, zone, id)))

    def list_nodes(self, version, project, zone):
        items, token = self.world.list_nodes(project, zone, _page_size(), request.args.get("pageToken", ""))
        body: dict[str, Any] = {"nodes": [render_node(self.world, n) for n in items]}
        if token:
            body["nextPageToken"] = token
        return _json_response(body)

    def delete_node(self, version, project, zone, id):
        op = self.world.delete_node(project, zone, id, api_version=version)
        return _json_response(render_operation(self.world, op, version))

    def get_guest_attributes(self, version, project, zone, id):
        body = _request_json()
        query_path = body.get("queryPath") or ""
        worker_ids = body.get("workerIds") or []
        if not isinstance(query_path, str) or not isinstance(worker_ids, list):
            raise invalid("queryPath must be a string and workerIds a list of strings")
        per_worker = self.world.get_guest_attributes(project, zone, id, query_path, worker_ids)
        return _json_response({"guestAttributes": [
            {"queryPath": query_path,
             "queryValue": {"items": [{"namespace": a.namespace, "key": a.key, "value": a.value} for a in items]}}
            for items in per_worker
        ]})

    def get_operation(self, version, project, zone, id):
        return _json_response(render_operation(self.world, self.world.get_operation(project, zone, id), version))


def _split_name(name: str, collection: str) -> tuple[str, str, str]:
    m = re.fullmatch(rf"projects/([^/]+)/locations/([^/]+)/{collection}/([^/]+)", name or "")
    if not m:
        raise invalid(f"'name' must look like projects/P/locations/Z/{collection}/ID, got {name!r}", "name")
    return m.group(1), m.group(2), m.group(3)


def record_call(call_log: CallLog, world: FakeTpuWorld, response: Response) -> None:
    """Append the current request and its answer to the call log (inside a Flask request)."""
    raw = request.get_data(cache=True)
    try:
        body: Any = json.loads(raw) if raw.strip() else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    now = world.clock.now()
    call_log.append(
        {
            "method": request.method,
            "path": request.path,
            "query": unquote(request.query_string.decode("utf-8", "replace")),
            "args": request.args.to_dict(),
            "body": body,
            "time": rfc3339(world.clock.wall(now)),
            "scenario_time": now,
            "status": response.status_code,
        }
    )


def add_log_routes(app: Flask, world: FakeTpuWorld, call_log: CallLog) -> None:
    """`GET /_fake/health`, `GET /_fake/calls` and `DELETE /_fake/calls` (FakeTpuControl's health and calls)."""

    @app.get("/_fake/health")
    def _health():
        return _json_response({"ok": True, "scenario_time": world.clock.now()})

    @app.get("/_fake/calls")
    def _calls():
        return _json_response({"calls": call_log.snapshot()})

    @app.delete("/_fake/calls")
    def _clear_calls():
        call_log.clear()
        return _json_response({})


def create_app(
    world: FakeTpuWorld,
    call_log: CallLog,
    *,
    after_change: Callable[[], None] = lambda: None,
    host_info: Callable[[str], list[dict]] = lambda name: [],
    fault_layer: FaultLayer | None = None,
    preempt_with_notice: Callable[[str, float], None] | None = None,
    hold_device: Callable[[str, int, str], dict] | None = None,
) -> Flask:
    app = Flask("tpuq_dev.faketpu")
    api = RestApi(world, after_change)

    @app.errorhandler(ApiError)
    def _api_error(err: ApiError):
        return _json_response(err.to_json(), err.http_status)

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException):
        # Unrouted paths and methods answer in the API's error shape too, never an HTML page.
        status = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(err.code or 500, "INVALID_ARGUMENT")
        body = {"error": {"code": err.code, "message": err.description, "status": status, "details": []}}
        return _json_response(body, err.code or 500)

    @app.after_request
    def _record(response: Response):
        if not request.path.startswith("/_fake/"):
            record_call(call_log, world, response)
        return response

    add_fault_layer(app, fault_layer or FaultLayer())  # after _record: the log keeps what the client was answered

    @app.route("/<version>/<path:path>", methods=["GET", "POST", "DELETE", "PATCH"])
    def _rest(version: str, path: str):
        return api.dispatch(version, path)

    # -- control endpoints (fake only) ------------------------------------------------

    def control_body() -> dict:
        return _request_json()

    add_log_routes(app, world, call_log)

    @app.post("/_fake/preempt")
    def _preempt():
        body = control_body()
        project, zone, node_id = _split_name(body.get("name", ""), "nodes")
        try:
            notice = float(body.get("notice") or 0)
        except (TypeError, ValueError):
            raise invalid("'notice' must be a number of seconds", "notice") from None
        if notice < 0:
            raise invalid("'notice' must be 0 or more seconds", "notice")
        if notice and preempt_with_notice is not None:
            # The notice on the hosts' metadata servers now, the preemption `notice` real seconds later.
            node = world.get_node(project, zone, node_id)
            if node.state != NodeState.READY:
                raise ApiError("FAILED_PRECONDITION", f"node {node.name} is {node.state.value}, not READY")
            preempt_with_notice(node.name, notice)
            return _json_response(render_node(world, node))
        node = world.preempt_node(project, zone, node_id)
        after_change()
        return _json_response(render_node(world, node))

    @app.post("/_fake/hold")
    def _hold():
        body = control_body()
        project, zone, node_id = _split_name(body.get("name", ""), "nodes")
        node = world.get_node(project, zone, node_id)
        if hold_device is None:
            raise invalid("this fake has no worker hosts")
        try:
            held = hold_device(node.name, int(body.get("worker", 0)), str(body.get("device") or "/dev/vfio/0"))
        except ValueError as e:
            raise invalid(str(e), "worker") from None
        return _json_response(held)

    @app.post("/_fake/health")
    def _set_health():
        body = control_body()
        project, zone, node_id = _split_name(body.get("name", ""), "nodes")
        health = _member(TpuHealth, body.get("health"), "health")
        symptom = _member(SymptomType, body["symptom"], "symptom") if body.get("symptom") else None
        node = world.set_node_health(project, zone, node_id, health, body.get("description") or None, symptom,
                                     body.get("details") or None, int(body.get("worker", 0)))
        return _json_response(render_node(world, node))

    @app.post("/_fake/maintenance")
    def _maintenance():
        body = control_body()
        project, zone, node_id = _split_name(body.get("name", ""), "nodes")
        starts_in = body.get("starts_in")
        node = world.schedule_maintenance(
            project, zone, node_id, None if starts_in is None else float(starts_in),
            float(body.get("duration", 3600)), _member(MaintenanceType, body.get("type") or MaintenanceType.SCHEDULED, "type"),
            bool(body.get("can_reschedule", True)))
        return _json_response(render_node(world, node))

    @app.post("/_fake/fail")
    def _fail():
        body = control_body()
        project, zone, qr_id = _split_name(body.get("name", ""), "queuedResources")
        qr = world.fail_queued_resource(project, zone, qr_id, str(body.get("error_class", "")))
        after_change()
        return _json_response(render_queued_resource(world, qr))

    @app.post("/_fake/faults")
    def _faults():
        body = control_body()
        status = str(body.get("status", "UNAVAILABLE"))
        error_class = body.get("error_class") or None
        if error_class is not None and error_class not in ERROR_CLASSES:
            raise invalid(f"unknown error class {error_class!r}; expected one of {', '.join(ERROR_CLASSES)}",
                          "error_class")
        if status not in HTTP_STATUS:
            raise invalid(f"unknown status {status!r}; expected one of {', '.join(HTTP_STATUS)}", "status")
        world.add_fault(
            ApiCallFault(
                status=status,
                # With an error class, a message given replaces the class's text only (its details stay): a test
                # can so show that the claimer reads the ErrorInfo, not the words.
                message=str(body.get("message") or ("" if error_class else
                                                     f"The service is currently unavailable ({status}, injected).")),
                method=(body.get("method") or None) and str(body["method"]).upper(),
                path_contains=body.get("path_contains"),
                remaining=int(body.get("count", 1)),
                error_class=error_class,
            )
        )
        return _json_response({})

    @app.post("/_fake/capacity")
    def _capacity():
        body = control_body()
        if "zone" not in body:
            raise invalid("'zone' is required", "zone")
        stockout = body.get("stockout")
        if stockout not in (True, False, None):
            raise invalid("'stockout' must be true, false or null", "stockout")
        effect = body.get("effect", "fail")
        if effect not in ("fail", "wait"):
            raise invalid("'effect' must be 'fail' or 'wait'", "effect")
        world.set_stockout(body["zone"], body.get("family"), stockout, effect)
        return _json_response({})

    @app.post("/_fake/billing")
    def _billing():
        body = control_body()
        enabled = body.get("enabled")
        if enabled not in (True, False, None):
            raise invalid("'enabled' must be true, false or null", "enabled")
        world.set_billing(body.get("project"), enabled)
        return _json_response({})

    @app.get("/_fake/node")
    def _node_info():
        project, zone, node_id = _split_name(request.args.get("name", ""), "nodes")
        node = world.get_node(project, zone, node_id)
        return _json_response({"node": render_node(world, node), "hosts": host_info(node.name)})

    @app.get("/_fake/quota")
    def _quota():
        args = request.args
        project, zone, family, tier = args.get("project"), args.get("zone"), args.get("family"), args.get("tier")
        if not (project and zone and family and tier in ("spot", "on_demand")):
            raise invalid("give project, zone, family and tier (spot|on_demand)")
        used = world.quota_used(project, zone, family, tier)
        return _json_response({"used": used, "limit": world.scenario.quota_limit(zone, family, tier)})

    return app
