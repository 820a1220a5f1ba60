"""How tpuq numbers the workers of an attempt, and how it shows them (`[w3]`, `[s1/w0]`). Pure, no I/O.

A single-slice attempt's workers are the node's own: worker w is `networkEndpoints[w]` (0..hosts-1).

A multislice attempt (issue 37, Cloud TPU Multislice) runs on every worker of N slices of one type, so every slice
has the same number of hosts. Its workers form one flat list, slice after slice:

    global id  g = slice * hosts_per_slice + w        (w: the worker's id within its slice, 0..hosts-1)

The global id is the attempt's worker id everywhere tpuq keeps one per worker: the status object
`tpuq/status/{job}/{n}/worker-{g}.json`, the log prefix `.../tpuq-logs/worker-{g}/`, the outcome's `exit_codes`
keys, the executor's SSH pool and probes. So for slices = 1 the numbering is today's. The job itself sees the
per-slice id in TPU_WORKER_ID (what JAX expects within a slice) and the global one in TPUQ_WORKER_GLOBAL_ID.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tpuq.contracts.tputypes import parse_accelerator_type


def global_worker_id(slice_id: int, worker_id: int, hosts_per_slice: int) -> int:
    """The attempt's id of worker `worker_id` of slice `slice_id`."""
    if not 0 <= worker_id < hosts_per_slice or slice_id < 0:
        raise ValueError(f"worker {worker_id} of slice {slice_id}: a slice has workers 0..{hosts_per_slice - 1}")
    return slice_id * hosts_per_slice + worker_id


def split_worker_id(global_id: int, hosts_per_slice: int) -> tuple[int, int]:
    """(slice, worker within the slice) of the attempt's worker `global_id`."""
    return divmod(global_id, hosts_per_slice)


def worker_label(global_id: int, hosts_per_slice: int | None = None, slices: int = 1) -> str:
    """How a worker is named in log prefixes and rows: `w3` on one slice, `s1/w0` on several (the brackets are the
    caller's). Without the slice size (not known yet), the global id alone."""
    if slices <= 1 or not hosts_per_slice:
        return f"w{global_id}"
    s, w = split_worker_id(global_id, hosts_per_slice)
    return f"s{s}/w{w}"


def job_worker_labels(types: Sequence[str], slice_counts: Sequence[int]) -> Callable[[int], str]:
    """A job's worker labels from its spec (JobDoc.spec_tpu, JobDoc.spec_slice_counts): `s1/w0` when it asked for
    several slices (one type, so one slice size; an elastic job that got fewer is numbered the same way), else `w3`.
    Used wherever a log line or row names its worker: `tpuq logs`, `submit --follow`, the dashboard."""
    slices = max(slice_counts, default=1)
    hosts = None
    if slices > 1 and len(types) == 1:
        try:
            hosts = parse_accelerator_type(types[0]).hosts
        except ValueError:  # tputypes.UnknownAcceleratorType: the global id alone
            hosts = None
    return lambda global_id: worker_label(global_id, hosts, slices)
