"""Shell (the Cloud TPU API): create, exact GET and delete of queued resources, in the claimer's terms.

Errors go through `tpuq.contracts.errors.from_api_error` once. Transient ones (429, 503,
deadline exceeded...) are retried here with exponential backoff (tenacity);
what still fails becomes an "unknown" observation, never "gone". Only exact
names are read: no list call is ever made.

Nodes are read as the REST API's JSON (`NodeJsonReader`, one exact GET) where a
reader is given, as the service's always is: google-cloud-tpu's `tpu_v2.Node`
has no `upcoming_maintenance` field and its REST transport drops unknown fields,
so the typed client can never see a maintenance notice. The typed node is then
parsed from the same JSON, for the endpoints and the rest.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from google.protobuf import duration_pb2

from tpuq.runtime.concurrency import map_concurrently
from tpuq.runtime.httppool import widened
from tpuq.claimer.model import NodeInfo, Observation, QrRecord, create_request_id
from tpuq.claimer.sshkeys import ssh_keys_metadata
from tpuq.contracts.documents import NodeHealth
from tpuq.contracts.documents import QueuedResourceState as Qr
from tpuq.capacity.existing import NodeRead
from tpuq.contracts.errors import AlreadyExists, NotFound, Retryable, TpuqError, call_api, error_info_of, status_error_info
from tpuq.contracts.fleet import FleetFile, worker_network_tag
from tpuq.contracts.messages import WorkerEndpoint
from tpuq.runtime.ownership import is_ours, owner_labels
from tpuq.runtime.rawproto import raw_message, state_name

log = logging.getLogger("tpuq.claimer.tpu")


def rpc_code(exc: BaseException) -> int | None:
    status = getattr(exc, "grpc_status_code", None)
    try:
        return int(status.value[0]) if status is not None else None
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


# OS Login off on the nodes we create, so that the executor's key in `ssh-keys` is honoured. The org policy
# compute.requireOsLogin overrides it; deploy checks that policy read-only and says what to do.
OS_LOGIN_METADATA = {"enable-oslogin": "FALSE"}


def node_metadata(fleet: FleetFile, public_key: str) -> dict[str, str]:
    return {"ssh-keys": ssh_keys_metadata(fleet.ssh_user, public_key), **OS_LOGIN_METADATA}


def build_queued_resource(qr: QrRecord, fleet: FleetFile, public_key: str, worker_service_account: str | None = None):
    """The create body: labels, ssh-keys metadata (OS Login off), tier, validUntilDuration, the fleet's
    network and subnetwork, external IPs as `external_ips_for` says, the workers' network tag, and the workers'
    service account when one is given (`Settings.worker_service_account`, $TPUQ_WORKER_SERVICE_ACCOUNT)."""
    from google.cloud import tpu_v2

    entry = fleet.entry(qr.entry_id)
    if entry is None:
        raise ValueError(f"queued resource {qr.qr_id} names entry {qr.entry_id!r}, which the fleet no longer has")
    accel = entry.accelerator
    node = tpu_v2.Node(
        accelerator_type=accel.name,
        runtime_version=entry.runtime_version,
        labels=owner_labels(fleet, qr.request_id),
        metadata=node_metadata(fleet, public_key),
        # network/subnetwork are names in the node's project ("default"), as gcloud's --network sends them; the
        # fleet file refuses other forms (tpuq.contracts.fleet: no Shared VPC yet).
        network_config=tpu_v2.NetworkConfig(network=fleet.network, subnetwork=fleet.subnetwork,
                                            enable_external_ips=fleet.external_ips_for(accel)),
        # The firewall rule deploy checks admits tcp:22 from the executor's tag to this one.
        tags=[worker_network_tag(fleet.owner_prefix)],
        scheduling_config=tpu_v2.SchedulingConfig(spot=True) if entry.spot else None,
    )
    if worker_service_account:
        # The workers write logs and status to the job's bucket as this account (deploy grants it exactly
        # that), not as the Compute Engine default account.
        node.service_account = tpu_v2.ServiceAccount(
            email=worker_service_account, scope=["https://www.googleapis.com/auth/cloud-platform"])
    parent = f"projects/{qr.project}/locations/{qr.zone}"
    if qr.slices > 1:
        # One queued resource of `slices` slices (Cloud TPU Multislice: "if you use Multislice, you must use queued
        # resources"). MultisliceParams replaces node_id; nodes are named <prefix>-0 .. <prefix>-<n-1>, every one
        # with this node spec, so every node carries the ownership labels (QueuedResource.Tpu.NodeSpec,
        # https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources).
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=parent, node=node,
            multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=qr.slices, node_id_prefix=qr.qr_id))
    else:
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=qr.qr_id, node=node)
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=fleet.claim.valid_until_seconds)
        ),
    )
    if entry.spot:
        resource.spot = tpu_v2.QueuedResource.Spot()
    else:
        resource.guaranteed = tpu_v2.QueuedResource.Guaranteed()
    return resource


def _endpoints(node) -> tuple[WorkerEndpoint, ...]:
    node = raw_message(node) or node  # read through the protobuf: one pass a tick over every ACTIVE node
    return tuple(_endpoint(i, ep.ip_address, ep.access_config.external_ip or None, ep.port or None)
                 for i, ep in enumerate(node.network_endpoints))


# (worker id, ip, external ip, port) -> its WorkerEndpoint: the watch reads the same endpoints of every ACTIVE node
# each pass, and a (frozen) endpoint validated once serves them all
_ENDPOINTS: dict[tuple, WorkerEndpoint] = {}


def _endpoint(worker_id: int, ip: str, external_ip: str | None, port: int | None) -> WorkerEndpoint:
    key = (worker_id, ip, external_ip, port)
    endpoint = _ENDPOINTS.get(key)
    if endpoint is None:
        endpoint = WorkerEndpoint(worker_id=worker_id, ip=ip, external_ip=external_ip, port=port)
        if len(_ENDPOINTS) >= 4096:
            _ENDPOINTS.clear()
        _ENDPOINTS[key] = endpoint
    return endpoint


class NodeJsonReader:
    """`GET v2/{name}` of one node, returning the REST API's JSON (camelCase, enums by name): every field the
    API sends, `upcomingMaintenance` included. Credentials as the typed client would use: anonymous against a
    local endpoint (`TPUQ_TPU_API_ENDPOINT`), Application Default Credentials against Google. The session is
    created on the first read. An HTTP error raises google.api_core's exception for it (`call_api` maps it)."""

    DEFAULT_ENDPOINT = "https://tpu.googleapis.com"
    SCOPE = "https://www.googleapis.com/auth/cloud-platform"

    def __init__(self, endpoint: str | None = None, session: Any = None, timeout: float = 30.0):
        endpoint = (endpoint or self.DEFAULT_ENDPOINT).rstrip("/")
        self.endpoint = endpoint if "://" in endpoint else f"https://{endpoint}"  # as ClientOptions reads it
        self.local = endpoint != self.DEFAULT_ENDPOINT
        self._session = session
        self._session_lock = threading.Lock()  # the first watch pass's reads all ask for it at once: one is made
        self.timeout = timeout

    def _get_session(self):
        with self._session_lock:
            if self._session is None:
                from google.auth.transport.requests import AuthorizedSession

                if self.local:
                    from google.auth.credentials import AnonymousCredentials

                    credentials = AnonymousCredentials()
                else:
                    import google.auth

                    credentials, _ = google.auth.default(scopes=[self.SCOPE])
                self._session = widened(AuthorizedSession(credentials))  # a watch pass reads many nodes at once
            return self._session

    def __call__(self, name: str) -> dict:
        from google.api_core import exceptions

        response = self._get_session().get(f"{self.endpoint}/v2/{name}", timeout=self.timeout)
        if response.status_code >= 400:
            raise exceptions.from_http_response(response)
        return response.json()


def _keep_error_details(mapped: TpuqError, original: BaseException) -> None:
    """Keep what the classifier reads first: the RPC code and the error's ErrorInfo (reason, domain, metadata)."""
    mapped.rpc_code = rpc_code(original)  # type: ignore[attr-defined]
    mapped.error_info = error_info_of(original)  # type: ignore[attr-defined]


class TpuApi:
    def __init__(self, client: Any, *, attempts: int = 4, initial_wait: float = 0.2, max_wait: float = 2.0,
                 max_workers: int = 16, node_json: NodeJsonReader | None = None,
                 worker_service_account: str | None = None):
        self.client = client
        self.node_json = node_json  # None: nodes through the typed client (no upcoming maintenance: tests only)
        self.worker_service_account = worker_service_account  # attached to the nodes it creates (None: the default)
        self.attempts = attempts
        self.initial_wait = initial_wait
        self.max_wait = max_wait
        self.max_workers = max_workers

    def _call(self, fn, **kwargs):
        """Call the API; transient errors retried with backoff; raises a taxonomy error (original as __cause__)."""
        return call_api(fn, attempts=self.attempts, initial_wait=self.initial_wait, max_wait=self.max_wait,
                        annotate=_keep_error_details, **kwargs)

    # ------------------------------------------------------------ create
    def create(self, qr: QrRecord, fleet: FleetFile, public_key: str) -> Observation:
        from google.cloud import tpu_v2

        request = tpu_v2.CreateQueuedResourceRequest(
            parent=f"projects/{qr.project}/locations/{qr.zone}",
            queued_resource_id=qr.qr_id,
            queued_resource=build_queued_resource(qr, fleet, public_key, self.worker_service_account),
            request_id=create_request_id(qr.project, qr.zone, qr.qr_id),
        )
        try:
            # The operation is not awaited: the watch reads the resource's state by name.
            self._call(self.client.create_queued_resource, request=request)
        except AlreadyExists:
            return Observation.found(Qr.CREATING)  # ours already (same deterministic name): a redelivery
        except Retryable as e:
            log.warning("create %s still failing after %d tries: %s", qr.name, self.attempts, e)
            return Observation("unknown", error_message=str(e))
        except TpuqError as e:
            return Observation("create_failed", error_code=getattr(e, "rpc_code", None), error_message=str(e),
                               error_info=getattr(e, "error_info", None))
        return Observation.found(Qr.CREATING)

    # ------------------------------------------------------------ watch
    def observe(self, qr: QrRecord) -> Observation:
        try:
            resource = self._call(self.client.get_queued_resource, name=qr.name)
        except NotFound:
            return Observation("not_found")
        except TpuqError as e:
            return Observation("unknown", error_message=str(e))
        raw = raw_message(resource)
        state = state_name(raw) if raw is not None else resource.state.state.name
        if state == Qr.FAILED:
            error = resource.state.failed_data.error
            return Observation.found(state, error_code=error.code, error_message=error.message,
                                     error_info=status_error_info(error), resource=resource)
        node, nodes = None, ()
        if state == Qr.ACTIVE and qr.slices > 1:
            # A multislice request: every slice's node (one exact GET each); one unreadable concludes nothing.
            read = [self._read_node_info(name, qr) for name in qr.node_names]
            if all(read):
                node, nodes = read[0], tuple(read)
        elif state == Qr.ACTIVE:
            # Every watch pass of an ACTIVE slice also reads its node (one more exact GET): its health and
            # upcoming maintenance change with no other sign, and the Cloud TPU API sends no notification.
            node = self._node_info(resource, qr)
        return Observation.found(state, node=node, nodes=nodes, resource=resource)

    def get_node(self, name: str):
        """(the typed node, its health): one exact GET, raising the taxonomy's errors."""
        if self.node_json is None:
            node = self._call(self.client.get_node, name=name)
            return node, NodeHealth.from_api(json.loads(type(node).to_json(node, use_integers_for_enums=False)))
        from google.cloud import tpu_v2

        data = self._call(self.node_json, name=name)
        return tpu_v2.Node.from_json(json.dumps(data), ignore_unknown_fields=True), NodeHealth.from_api(data)

    def _node_info(self, resource, qr: QrRecord) -> NodeInfo | None:
        specs = (raw_message(resource) or resource).tpu.node_spec
        name = f"{specs[0].parent}/nodes/{specs[0].node_id}" if specs and specs[0].node_id else qr.node_name
        return self._read_node_info(name, qr)

    def _read_node_info(self, name: str, qr: QrRecord) -> NodeInfo | None:
        try:
            node, health = self.get_node(name)
        except TpuqError as e:
            log.warning("node %s of ACTIVE %s unreadable: %s", name, qr.name, e)
            return None
        # Both addresses are kept; the executor picks the one its fleet's ssh_transport reaches. `port` is
        # the TPU runtime's (8470), recorded as reported and never used for SSH.
        return NodeInfo(name=node.name or name, endpoints=_endpoints(node), health=health)

    def read_node(self, name: str) -> NodeRead:
        """An exact getNode of a node tpuq did not create (`existing:`); read only, never changed."""
        try:
            node, health = self.get_node(name)
        except NotFound:
            return NodeRead(found=False)
        except TpuqError as e:
            return NodeRead(found=False, error=str(e))
        return NodeRead(
            found=True, state=node.state.name, accelerator_type=node.accelerator_type or None,
            ssh_keys=dict(node.metadata).get("ssh-keys", ""), spot=bool(node.scheduling_config.spot),
            endpoints=_endpoints(node), health=health)

    def observe_all(self, qrs: Iterable[QrRecord]) -> dict[str, Observation]:
        """Exact GETs of the given queued resources, concurrently."""
        qrs = list(qrs)
        if not qrs:
            return {}
        return dict(zip((q.qr_id for q in qrs), map_concurrently(self.observe, qrs, self.max_workers)))

    # ------------------------------------------------------------ delete
    def delete(self, qr: QrRecord, fleet: FleetFile, force: bool, resource: Any = None) -> str:
        """Delete one queued resource after the ownership check; returns what happened, for the log."""
        from google.cloud import tpu_v2

        if resource is None:
            try:
                resource = self._call(self.client.get_queued_resource, name=qr.name)
            except NotFound:
                return "already gone"
            except TpuqError as e:
                return f"not deleted (unreadable: {e})"
        if not is_ours(resource, fleet):
            log.error("refusing to delete %s: it does not carry fleet %s's ownership marks", qr.name, fleet.name)
            return "refused: not ours"
        try:
            self._call(self.client.delete_queued_resource,
                       request=tpu_v2.DeleteQueuedResourceRequest(name=qr.name, force=force))
        except NotFound:
            return "already gone"
        except TpuqError as e:
            log.warning("delete %s failed (the next watch pass asks again): %s", qr.name, e)
            return f"failed: {e}"
        return "delete accepted"


__all__ = ["NodeJsonReader", "TpuApi", "build_queued_resource", "rpc_code"]
