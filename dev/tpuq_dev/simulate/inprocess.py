"""The Google APIs of a simulation, in process: what the services' own clients call, answered by the cloud.

- `SimTpuClient` has google-cloud-tpu `TpuClient`'s call shapes (the typed requests in, the typed resources
  out). Each answer is the REST API's JSON (tpuq_dev.capacitymodel.render) parsed the way the REST transport parses
  it, and each error is raised the way the REST transport raises it (`google.api_core.exceptions
  .from_http_response` of the API's error body), so `tpuq.contracts.errors` maps and classifies them as in production.
- `node_json` answers the claimer's `NodeJsonReader` (the REST JSON of one node).
- `SimGoogleApisSession` answers the claimer's pre-checks (Cloud Quotas, Cloud Billing) from the same world.
"""

from __future__ import annotations

import json
import re
from typing import Any

import requests
from google.api_core import exceptions as core_exceptions

from tpuq_dev.capacitymodel.errors import ApiError
from tpuq_dev.capacitymodel.render import TPU_SERVICE, render_billing_info, render_quota_info

from .cloud import SimCloud, body_key

_NAME = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)/(?P<kind>queuedResources|nodes)/(?P<id>[^/]+)$")
_PARENT = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)$")


def _response(status: int, body: dict, url: str = "https://tpu.googleapis.com/") -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(body).encode()
    response.headers["Content-Type"] = "application/json"
    response.url = url
    response.request = requests.Request("GET", url).prepare()
    return response


def raise_as_client(err: ApiError, url: str = "https://tpu.googleapis.com/") -> None:
    """Raise what the REST transport raises for this error body."""
    raise core_exceptions.from_http_response(_response(err.http_status, err.to_json(), url)) from None


def parse_json(message_type, data: dict):
    """The protobuf message (`message_type.pb()`) the REST transport's `json_format.Parse(response text,
    ignore_unknown_fields=True)` makes of the JSON body `data`: Parse is `json.loads` (refusing duplicate keys,
    which a dict cannot have) then `ParseDict`, so `ParseDict` of the dict itself, without its text."""
    from google.protobuf import json_format

    return json_format.ParseDict(data, message_type.pb()(), ignore_unknown_fields=True)


_SPLIT: dict[str, tuple[str, str]] = {}  # resource name -> (zone, id): a run reads the same names over and over


def _split(name: str) -> tuple[str, str]:
    found = _SPLIT.get(name)
    if found is not None:
        return found
    m = _NAME.match(name)
    if m is None:
        raise_as_client(ApiError("INVALID_ARGUMENT", f"Invalid resource name {name!r}"))
    if len(_SPLIT) > 100_000:
        _SPLIT.clear()
    found = _SPLIT[name] = (m["zone"], m["id"])
    return found


class SimTpuClient:
    def __init__(self, cloud: SimCloud) -> None:
        self.cloud = cloud
        self._parsed: dict[tuple[type, str], bytes] = {}  # the same JSON parses to the same message: parse it once
        self._bases: dict[bytes, bytes] = {}  # a queued resource's body but its state -> that part parsed (`_parse`)
        # The claimer's repeated observations (`simulate.observed`): queued resource id -> (its record, the calls
        # its observation made as (kind, name, body key), the observation); the answers of calls already made,
        # to hand out in order (kind, name, (body, key) or the exception); the calls made, while recorded.
        self.observed: dict[str, tuple] = {}
        self.prefetched: list[tuple[str, str, Any]] = []
        self.recording: list[tuple[str, str, bytes | None]] | None = None

    def _parse(self, message_type, data: dict, key: bytes | None = None):
        """The body parsed as the REST transport parses it (`parse_json`); a fresh message every time.
        `key`: the body's `body_key`, when known."""
        key = (message_type, key or body_key(data))
        wire = self._parsed.get(key)
        if wire is None:
            if len(self._parsed) > 50_000:
                self._parsed.clear()
            wire = self._parsed[key] = self._parse_new(message_type, data)
        return message_type.deserialize(wire)

    def _parse_new(self, message_type, data: dict) -> bytes:
        """`parse_json` of a body not parsed yet, serialized. A queued resource's body changes only in its `state`
        over its life (SimCloud renders the rest from what is fixed at its create), so the rest is parsed once per
        distinct content and the state parsed into a copy of it: `ParseDict` sets the fields it is given on the
        message it is given, so the two parts make the message the whole body makes (checked against a whole
        parse with `SimCloud.check_bodies`)."""
        from google.cloud import tpu_v2
        from google.protobuf import json_format

        if message_type is not tpu_v2.QueuedResource or "state" not in data:
            return parse_json(message_type, data).SerializeToString()
        rest = {k: v for k, v in data.items() if k != "state"}
        rest_key = body_key(rest)
        base = self._bases.get(rest_key)
        if base is None:
            if len(self._bases) > 20_000:
                self._bases.clear()
            base = self._bases[rest_key] = parse_json(message_type, rest).SerializeToString()
        message = message_type.pb().FromString(base)
        json_format.ParseDict({"state": data["state"]}, message, ignore_unknown_fields=True)
        wire = message.SerializeToString()
        if self.cloud.check_bodies:
            whole = parse_json(message_type, data)
            assert message == whole and wire == whole.SerializeToString(), f"{data.get('name')}: parsed in parts wrong"
        return wire

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except ApiError as e:
            raise_as_client(e)

    # -- exact reads' answers: (the REST JSON, not to be changed; its `body_key`), raised as the client raises ------
    def fetch(self, kind: str, name: str) -> tuple[dict, bytes]:
        """One exact read (`qr`: a queued resource, `node`: a node) from the cloud, counted."""
        zone, resource_id = _split(name)
        return self._call(self.cloud.queued_resource_body if kind == "qr" else self.cloud.node_body, zone,
                          resource_id)

    def _answer(self, kind: str, name: str) -> tuple[dict, bytes]:
        """`fetch`, or the answer already fetched for this call (`prefetched`'s first); noted while recording."""
        if self.prefetched and self.prefetched[0][:2] == (kind, name):
            answer = self.prefetched.pop(0)[2]
            if isinstance(answer, BaseException):
                self._note(kind, name, None)
                raise answer
        else:
            try:
                answer = self.fetch(kind, name)
            except BaseException:
                self._note(kind, name, None)
                raise
        self._note(kind, name, answer[1])
        return answer

    def _note(self, kind: str, name: str, key: bytes | None) -> None:
        if self.recording is not None:
            self.recording.append((kind, name, key))

    # -- queued resources -----------------------------------------------------------------------
    def create_queued_resource(self, request=None, **_: Any):
        from google.cloud import tpu_v2

        m = _PARENT.match(request.parent)
        body = json.loads(tpu_v2.QueuedResource.to_json(request.queued_resource, use_integers_for_enums=False))
        op = self._call(self.cloud.create_queued_resource, m["zone"], request.queued_resource_id, body,
                        request.request_id or None)
        return op  # the operation is never awaited by tpuq

    def get_queued_resource(self, name: str = "", **_: Any):
        from google.cloud import tpu_v2

        return self._parse(tpu_v2.QueuedResource, *self._answer("qr", name))

    def list_queued_resources(self, parent: str = "", request=None, **_: Any):
        from google.cloud import tpu_v2

        m = _PARENT.match(parent or request.parent)
        items = self._call(self.cloud.queued_resource_bodies, m["zone"])
        return [self._parse(tpu_v2.QueuedResource, d, key) for d, key in items]

    def delete_queued_resource(self, request=None, name: str = "", **_: Any):
        zone, qr_id = _split(request.name if request is not None else name)
        force = bool(request.force) if request is not None else False
        return self._call(self.cloud.delete_queued_resource, zone, qr_id, force)

    # -- nodes ------------------------------------------------------------------------------------
    def get_node(self, name: str = "", **_: Any):
        from google.cloud import tpu_v2

        return self._parse(tpu_v2.Node, *self.node_body(name))

    def node_json(self, name: str) -> dict:
        return self.node_body(name)[0]

    def node_body(self, name: str) -> tuple[dict, bytes]:
        """The node's REST JSON (not to be changed) and its `body_key`."""
        return self._answer("node", name)

    def list_nodes(self, parent: str = "", request=None, **_: Any):
        from google.cloud import tpu_v2

        m = _PARENT.match(parent or request.parent)
        items = self._call(self.cloud.node_bodies, m["zone"])
        return [self._parse(tpu_v2.Node, d, key) for d, key in items]

    def delete_node(self, name: str = "", request=None, **_: Any):
        zone, node_id = _split(request.name if request is not None else name)
        return self._call(self.cloud.delete_node, zone, node_id)


class SimGoogleApisSession:
    """A `requests.Session`-like `.get(url)` for the pre-checks' Cloud Quotas and Cloud Billing reads."""

    QUOTAS = re.compile(rf"/v1/projects/(?P<project>[^/]+)/locations/global/services/{re.escape(TPU_SERVICE)}"
                        r"/quotaInfos/(?P<qid>[^/?]+)$")
    BILLING = re.compile(r"/v1/projects/(?P<project>[^/]+)/billingInfo$")

    def __init__(self, cloud: SimCloud) -> None:
        self.cloud = cloud

    def get(self, url: str, **_: Any) -> requests.Response:
        world = self.cloud.world
        try:
            if m := self.QUOTAS.search(url):
                self.cloud.count("quotaInfos.get")
                return _response(200, render_quota_info(world, m["project"], m["qid"]), url)
            if m := self.BILLING.search(url):
                self.cloud.count("billingInfo.get")
                if world.scenario.billing.permission_denied:
                    raise ApiError("PERMISSION_DENIED", "The caller does not have permission")
                return _response(200, render_billing_info(world, m["project"]), url)
        except ApiError as e:
            return _response(e.http_status, e.to_json(), url)
        except KeyError:
            return _response(404, ApiError("NOT_FOUND", f"{url} not found").to_json(), url)
        return _response(404, ApiError("NOT_FOUND", f"{url} not found").to_json(), url)
