"""The jobs a simulation runs: each one's arrival, acceptable TPU types, priority, regions and work."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimJob:
    job_id: str
    submit_at: float  # simulation seconds
    types: tuple[str, ...]  # acceptable accelerator types, as a job file's `tpu:` lists them
    priority: str  # a tpuq priority name (tpuq.jobspec)
    work_seconds: float  # the work itself, once the workers have set up
    checkpoint_seconds: float | None = None  # a preempted attempt keeps the work up to its last checkpoint
    regions: tuple[str, ...] | None = None  # None: any region the fleet has
