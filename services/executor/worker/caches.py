"""Caches that outlive an attempt: which to keep, and their links into JOB_DIR."""

from __future__ import annotations

import os

from .errors import SetupError
from .files import rmtree


def sort_caches(cache_root: str, declared: list[dict]) -> list[str]:
    """Keep a cache only if this job declares its key and it is `.ready`; create the missing ones."""
    notes: list[str] = []
    keys = {c["key"] for c in declared}
    os.makedirs(cache_root, exist_ok=True)
    for entry in sorted(os.listdir(cache_root)):
        path = os.path.join(cache_root, entry)
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        if entry in keys and is_dir and os.path.exists(os.path.join(path, ".ready")):
            notes.append(f"cache {entry}: kept")
            continue
        why = "not declared by this job" if entry not in keys else "incomplete"
        rmtree(path)
        notes.append(f"cache {entry}: deleted ({why})")
    for key in sorted(keys):
        os.makedirs(os.path.join(cache_root, key), exist_ok=True)
    return notes


def link_cache(job_dir: str, rel_path: str, cache_dir: str) -> None:
    """Make JOB_DIR/<rel_path> a symlink to the cache directory (outside the workspace)."""
    parts = [p for p in rel_path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel_path.startswith("/"):
        raise SetupError(f"cache path {rel_path!r} must be a relative path inside the job directory")
    target = os.path.join(job_dir, *parts)
    parent = os.path.dirname(target)
    real_job_dir = os.path.realpath(job_dir)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise SetupError(f"cache path {rel_path!r}: cannot create its directory: {e.strerror}") from None
    real_parent = os.path.realpath(parent)
    if real_parent != real_job_dir and not real_parent.startswith(real_job_dir + os.sep):
        raise SetupError(f"cache path {rel_path!r} leads outside the job directory through a bundle symlink")
    if os.path.lexists(target):
        raise SetupError(f"cache path {rel_path!r} already exists in the bundle; remove it from the bundle")
    os.symlink(cache_dir, target)
