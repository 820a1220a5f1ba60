"""The janitor: deletes what tpuq no longer needs, and only what tpuq owns.

Triggered by fleet events (race losers, dead resources, at once), attempt
events (a preempted TPU) and ticks (idle TPUs, a sweep of everything Firestore
knows, and a rate-limited orphan scan). Pure rules live in `decide`, the only
API door in `deleter` (every delete checks `tpuq.runtime.ownership.is_ours` first),
the thin shell in `handlers`.

Rules, and why:
- Race losers: when a request has `count` ACTIVE queued resources, its other
  racers lose. ACCEPTED / WAITING_FOR_RESOURCES ones are deleted in the same
  event handling (a loser that turns ACTIVE later starts billing). A PROVISIONING
  loser cannot be deleted (the API refuses): it is looked at again on its next
  event or tick. If it turns ACTIVE it is surplus and deleted in that event,
  unless the scheduler has already made it busy (it serves a job) or a job other
  than the request's own is pending (the scheduler may use it; if not, the idle
  rule removes it after the idle timeout). Winners are ranked: busy first, then
  the one the scheduler recorded first; so of two that win in the same instant,
  the one serving the job stays. A withdrawn request's `count` still caps its race.
- Idle TPUs: idle longer than the entry's idle timeout (fleet default 600 s),
  longest idle first, while the entry keeps `keep_warm_count` live (idle or
  busy) TPUs. tpus/{id} goes idle -> deleting in a write conditioned on the
  document the decision read (the scheduler's assignment guards the same way),
  and only after that commit is the API called.
- Dead: SUSPENDED queued resources and PREEMPTED nodes hold quota: the janitor
  owns them and deletes them (force) on the attempt event that reports the
  preemption, on their fleet event and on the next tick's sweep. FAILED ones are
  the claimer's: it classifies the failure, backs off or drops the zone, records
  the class on queued_resources/{id}, then deletes. The janitor deletes a FAILED
  one only once that class is recorded (a backstop for a delete that did not
  take), so nothing removes a failure before it has been read; FAILED ones no
  Firestore document names are orphans (below).
- Orphans: owned (both marks) resources no Firestore document names, deleted
  once the janitor has seen them for `claim.orphan_grace_seconds`. Only on
  ticks, at most once per $TPUQ_JANITOR_ORPHAN_SCAN_SECONDS (600 s) per fleet.
"""
