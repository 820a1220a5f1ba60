"""The two ways a worker step fails: the job's own inputs, or the infrastructure."""

from __future__ import annotations

class SetupError(Exception):
    """The job's own inputs are wrong (bundle, caches, spec): the attempt fails terminally."""


class UnsafeBundle(SetupError):
    pass


class InfraError(Exception):
    """Something outside the job failed (GCS unreachable, disk): retrying may help."""
