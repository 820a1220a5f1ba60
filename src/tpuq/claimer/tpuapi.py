"""Shell (the Cloud TPU API): create, exact GET and delete of queued resources, in the claimer's terms.

Errors go through `tpuq.errors.from_api_error` once. Transient ones (429, 503,
deadline exceeded...) are retried here with exponential backoff (tenacity);
what still fails becomes an "unknown" observation, never "gone". Only exact
names are read: no list call is ever made.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.protobuf import duration_pb2

from tpuq.claimer.model import NodeInfo, Observation, QrRecord, create_request_id
from tpuq.claimer.sshkeys import ssh_keys_metadata
from tpuq.documents import QueuedResourceState as Qr
from tpuq.existing import NodeRead
from tpuq.errors import AlreadyExists, NotFound, Retryable, TpuqError, call_api, error_info_of, status_error_info
from tpuq.fleet import FleetFile, worker_network_tag
from tpuq.messages import WorkerEndpoint
from tpuq.ownership import is_ours, owner_labels

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


def build_queued_resource(qr: QrRecord, fleet: FleetFile, public_key: str):
    """The create body: labels, ssh-keys metadata (OS Login off), tier, validUntilDuration, the fleet's
    network and subnetwork, external IPs as `external_ips_for` says, and the workers' network tag."""
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
        # fleet file refuses other forms (tpuq.fleet: no Shared VPC yet).
        network_config=tpu_v2.NetworkConfig(network=fleet.network, subnetwork=fleet.subnetwork,
                                            enable_external_ips=fleet.external_ips_for(accel)),
        # The firewall rule deploy checks admits tcp:22 from the executor's tag to this one.
        tags=[worker_network_tag(fleet.owner_prefix)],
        scheduling_config=tpu_v2.SchedulingConfig(spot=True) if entry.spot else None,
    )
    worker_account = os.environ.get("TPUQ_WORKER_SERVICE_ACCOUNT")
    if worker_account:
        # The workers write logs and status to the job's bucket as this account (deploy grants it exactly
        # that), not as the Compute Engine default account.
        node.service_account = tpu_v2.ServiceAccount(
            email=worker_account, scope=["https://www.googleapis.com/auth/cloud-platform"])
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=f"projects/{qr.project}/locations/{qr.zone}", node_id=qr.qr_id, node=node)]
        ),
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
    return tuple(
        WorkerEndpoint(worker_id=i, ip=ep.ip_address, external_ip=ep.access_config.external_ip or None,
                       port=ep.port or None)
        for i, ep in enumerate(node.network_endpoints)
    )


def _keep_error_details(mapped: TpuqError, original: BaseException) -> None:
    """Keep what the classifier reads first: the RPC code and the error's ErrorInfo (reason, domain, metadata)."""
    mapped.rpc_code = rpc_code(original)  # type: ignore[attr-defined]
    mapped.error_info = error_info_of(original)  # type: ignore[attr-defined]


class TpuApi:
    def __init__(self, client: Any, *, attempts: int = 4, initial_wait: float = 0.2, max_wait: float = 2.0,
                 max_workers: int = 16):
        self.client = client
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
            queued_resource=build_queued_resource(qr, fleet, public_key),
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
        state = resource.state.state.name
        if state == Qr.FAILED:
            error = resource.state.failed_data.error
            return Observation.found(state, error_code=error.code, error_message=error.message,
                                     error_info=status_error_info(error), resource=resource)
        node = None
        if state == Qr.ACTIVE and (qr.state != Qr.ACTIVE or not qr.node):
            node = self._node_info(resource, qr)
        return Observation.found(state, node=node, resource=resource)

    def _node_info(self, resource, qr: QrRecord) -> NodeInfo | None:
        specs = resource.tpu.node_spec
        name = f"{specs[0].parent}/nodes/{specs[0].node_id}" if specs else qr.node_name
        try:
            node = self._call(self.client.get_node, name=name)
        except TpuqError as e:
            log.warning("node %s of ACTIVE %s unreadable: %s", name, qr.name, e)
            return None
        # Both addresses are kept; the executor picks the one its fleet's ssh_transport reaches. `port` is
        # the TPU runtime's (8470), recorded as reported and never used for SSH.
        return NodeInfo(name=node.name or name, endpoints=_endpoints(node))

    def read_node(self, name: str) -> NodeRead:
        """An exact getNode of a node tpuq did not create (`existing:`); read only, never changed."""
        try:
            node = self._call(self.client.get_node, name=name)
        except NotFound:
            return NodeRead(found=False)
        except TpuqError as e:
            return NodeRead(found=False, error=str(e))
        return NodeRead(
            found=True, state=node.state.name, accelerator_type=node.accelerator_type or None,
            ssh_keys=dict(node.metadata).get("ssh-keys", ""), spot=bool(node.scheduling_config.spot),
            endpoints=_endpoints(node))

    def observe_all(self, qrs: Iterable[QrRecord]) -> dict[str, Observation]:
        """Exact GETs of the given queued resources, concurrently."""
        qrs = list(qrs)
        if not qrs:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(qrs))) as pool:
            return dict(zip((q.qr_id for q in qrs), pool.map(self.observe, qrs)))

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


__all__ = ["TpuApi", "build_queued_resource", "rpc_code"]
