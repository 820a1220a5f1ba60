"""The janitor: deletes what tpuq no longer needs, and only what tpuq owns.

Triggered by fleet events (race losers, dead resources, at once), attempt
events (a preempted TPU) and ticks (idle TPUs, a sweep of everything Firestore
knows, and a rate-limited orphan scan). Pure rules live in `decide`, the only
API door in `deleter` (every delete checks `tpuq.ownership.is_ours` first),
the thin shell in `handlers`.

Rules, and why:
- Race losers: when a request has `count` ACTIVE queued resources, its other
  racers lose. ACCEPTED / WAITING_FOR_RESOURCES ones are deleted in the same
  event handling (a loser that turns ACTIVE later starts billing). A PROVISIONING
  loser cannot be deleted (the API refuses): it is looked at again on its next
  event or tick. If it turns ACTIVE it is surplus and deleted at once, unless the
  request's count has grown to cover it, some job is pending (the scheduler may
  use it; if not, the idle rule removes it after the idle timeout), or the
  scheduler has already made it busy. Winners are ranked: busy first, then the
  one the scheduler recorded first. A withdrawn request's ACTIVE slices are
  ordinary TPUs (idle rule), only its pending racers are losers.
- Idle TPUs: idle longer than the entry's idle timeout (fleet default 600 s),
  longest idle first, while the entry keeps `keep_warm_count` live (idle or
  busy) TPUs. tpus/{id} goes idle -> deleting in a write conditioned on the
  document the decision read (the scheduler's assignment guards the same way),
  and only after that commit is the API called.
- Dead: SUSPENDED / FAILED queued resources and PREEMPTED nodes hold quota:
  deleted (force) on their fleet event and on the next tick's sweep. The
  claimer may delete them too: NOT_FOUND is done, a state refusal is not retried.
- Orphans: owned (both marks) resources no Firestore document names, deleted
  once the janitor has seen them for `claim.orphan_grace_seconds`. Only on
  ticks, at most once per $TPUQ_JANITOR_ORPHAN_SCAN_SECONDS (600 s) per fleet.
"""
