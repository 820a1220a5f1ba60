"""The fleet simulator (`tpuq simulate`): a month of a TPU grant in a minute, with the services' own decision code.

- events: the virtual clock and the event loop (one heap, deterministic tie-break)
- cloud: the capacity model (tpuq_dev.capacitymodel) on the virtual clock, with every API call counted
- workload: the jobs (generated from a workload file, or a trace)
- workers: the slices' hosts as a model: an attempt's work, checkpoints, what a preemption loses
- bus: Pub/Sub in process, with delivery latency and duplicates
- waits: a handler that waits (the claimer's fast watch) without holding the rest of the world
- tpuq_policy: the four services' handlers over the in-memory store, driven by the bus and the ticks
- polling: a model of a single polling controller (tpu-runner 0.1.12's)
- bound: what any policy could at best get from the same capacity timeline
- metrics, report: utilization, waste by cause, waits, API calls; JSON and an HTML report

No service imports it; it imports no dev tooling (tests/unit/test_no_dev_imports.py).

Fidelity (tests/e2e/test_simulate_fidelity.py). One workload, 20 jobs on three fleet entries with two
stockouts, a quota-0 zone and two scripted preemptions (tests/e2e/fidelity/: every zone and every
preemption is forced, the scenario says how), runs on the local stack (the services as processes, the fake
Cloud TPU at time_scale 1, real sshd workers, a tick a second; the jobs submitted to a paused fleet, which is
then resumed) and here (the same fleet and scenario files, tick_seconds=1, setup_seconds=3, the same jobs in
the same order at the start). These must be equal: every job's final state, its number of attempts, the zone
of each attempt, and, per one-slice entry, the order in which attempts were given its slice.

Units: scenario seconds are the capacity model's clock. The stack's fake runs them time_scale times faster
than the services' real seconds; here services and cloud share one clock. So the two runs agree only at
time_scale 1, or when every scenario time is divided by the scale (ticks, jobs and fleet timeouts stay in
real seconds).

What may differ is timing only:
- a new slice: on the stack it turns ACTIVE only once the fake has started its sshd hosts (seconds each on a
  loaded machine); here, exactly at the scenario's delays;
- an attempt's setup: the stack's SSH, supervisor, status object and its notification, against a constant
  setup_seconds;
- ticks: the stack's ticker has its own phase, so a step that waits for a tick (the claimer's watch, the
  backstops) takes up to tick_seconds more or less; Pub/Sub latency: the emulator's push, against
  Delivery.latency (the test uses 5 ms, loopback's order of magnitude);
- the path: on a loaded stack a scheduler tick may record an ACTIVE slice before the claimer's event arrives
  (the log's "whose ACTIVE event never arrived"); the same result;
- node names: after a resume, two claimer ticks may race for a zone and the winner creates generation 1
  (tpuq-<request>-<zone>-1); which job's request makes the slice that replaces a preempted one: the preempted job
  backs off (retry.backoff_*) and the pass asks for the first job not backing off, which depends on how long
  the old slice took to go. Its zone, and who runs on it, do not change.
Bound: a job's finish differs by at most (slices created on its path) x (host start + a tick) + (attempts
before it on its slice) x (|the stack's setup - setup_seconds| + a tick). Measured on the fidelity workload
(about 75 s on the stack, load average 5 to 12, four runs): the stack finished each job 0 to 14 s later.
The test asserts the order, not the seconds, which depend on the machine's load.

Not modelled: a handler here takes no virtual time, and handlers run one at a time (a waiting one lets the
rest go on: `waits`). On a loaded stack a pass can take seconds and overlap another, so races between passes
happen there and never here. One seen on the stack, and fixed since: a job's intake pass (a pass for that job
only) gave a slice that had just turned idle to that job, before the ACTIVE event's pass gave it to an older,
higher priority job; an intake pass that would assign now plans the whole queue
(`tests/scheduler/test_assignment.py`). The fidelity test still submits to a paused fleet, so that every job is
queued before the first slice exists in both runs.
"""
