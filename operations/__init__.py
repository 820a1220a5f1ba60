"""The client layer: what the CLI (tpuq.cli) and the dashboard (tpuq.ui) both do, with no printing or argument
parsing. Both import it; it imports neither (tests/unit/test_import_layers.py).

- tpuq.operations.jobs       cancel, set-priority, the nudge tick, the reason worth showing
- tpuq.operations.jobreader  JobReader: one job as it runs (watch, submit --wait/--follow, the job page)
"""
