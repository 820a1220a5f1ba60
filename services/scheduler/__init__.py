"""The scheduler: pairs pending jobs with idle TPUs and asks for capacity.

`tpuq.scheduler.plan` is the pure matcher; the Firestore / Pub/Sub shell around
it lives in the other modules of this package.
"""

from tpuq.scheduler.plan import (
    IdleTpu,
    Match,
    PendingJob,
    Plan,
    compatible,
    fleet_options,
    order_key,
    plan,
    scheduling_order,
    short_node_name,
)

__all__ = [
    "IdleTpu",
    "Match",
    "PendingJob",
    "Plan",
    "compatible",
    "fleet_options",
    "order_key",
    "plan",
    "scheduling_order",
    "short_node_name",
]
