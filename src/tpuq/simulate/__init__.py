"""The fleet simulator (`tpuq simulate`): a month of a TPU grant in a minute, with the services' own decision code.

- events: the virtual clock and the event loop (one heap, deterministic tie-break)
- cloud: the capacity model (tpuq.capacitymodel) on the virtual clock, with every API call counted
- workload: the jobs (generated from a workload file, or a trace)
- workers: the slices' hosts as a model: an attempt's work, checkpoints, what a preemption loses
- bus: Pub/Sub in process, with delivery latency and duplicates
- tpuq_policy: the four services' handlers over the in-memory store, driven by the bus and the ticks
- polling: a model of a single polling controller (tpu-runner 0.1.12's)
- bound: what any policy could at best get from the same capacity timeline
- metrics, report: utilization, waste by cause, waits, API calls; JSON and an HTML report

No service imports it; it imports no dev tooling (tests/unit/test_no_dev_imports.py).
"""
