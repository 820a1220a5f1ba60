"""The worker hosts of a multislice queued resource: which slice each worker is in, as a TPU VM learns it.

On a TPU VM of a multislice queued resource the runtime writes the metadata attribute `tpu-env`, whose
`MEGASCALE_COORDINATOR_ADDRESS`, `MEGASCALE_NUM_SLICES` and `MEGASCALE_SLICE_ID` lines JAX reads when the process
environment lacks them (jax/_src/clusters/cloud_tpu_cluster.py, `get_tpu_env_value`; sources in MULTISLICE.md).
The fake writes those lines on every worker's metadata server once every slice's hosts run, before the request
turns ACTIVE, with worker 0 of slice 0 as the coordinator. It sets no process environment: that is the runner's.
"""

from __future__ import annotations

from collections.abc import Callable

from tpuq_dev.capacitymodel.model import FakeTpuWorld, NodeRecord
from tpuq_dev.capacitymodel.multislice import TPU_ENV_ATTRIBUTE, tpu_env

from .hosts import WorkerHost


def slice_node_names(world: FakeTpuWorld, node: NodeRecord) -> list[str]:
    """The full names of the node's request's slices, slice order; [] for a single-node request."""
    with world.lock:
        qr = world.queued_resources.get(node.queued_resource)
        if qr is None or qr.multislice is None:
            return []
        return [f"projects/{qr.project}/locations/{qr.zone}/nodes/{node_id}" for node_id in qr.slice_ids]


def publish_tpu_env(world: FakeTpuWorld, hosts_of: Callable[[str], list[WorkerHost]], node: NodeRecord) -> bool:
    """Write `tpu-env` on every worker of every slice of the node's request, if all their hosts run now.

    Idempotent (each slice's starter thread may call it; the last to see every slice running writes the lines
    before its own `hosts_started`, so before the request is ACTIVE)."""
    names = slice_node_names(world, node)
    hosts = [hosts_of(name) for name in names]
    if not names or not all(hosts):
        return False
    coordinator = hosts[0][0].internal_address
    for slice_id, slice_hosts in enumerate(hosts):
        lines = tpu_env(slice_id, len(names), coordinator)
        for host in slice_hosts:
            host.metadata.set_attribute(TPU_ENV_ATTRIBUTE, lines)
    return True
