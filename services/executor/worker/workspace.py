"""`prepare`: stop what an earlier attempt left, replace the workspace, fetch the bundle, sort the caches."""

from __future__ import annotations

import fcntl
import os
import signal

from .bundle import extract_bundle
from .caches import link_cache, sort_caches
from .errors import InfraError, SetupError
from .files import WorkerPaths, read_json, rmtree, write_json_atomic
from .gcs import Gcs, GcsError, retry, transient_gcs_error
from .preflight import PreflightFailed, run_preflight
from .processes import current_state, group_exists, lock_is_held, request_cancel, signal_group, supervisor_alive, wait_for
from .spec import load_spec, paths_for
from .status import build_status, publish_status


def stop_stale(paths: WorkerPaths, reason: str, grace: float) -> list[str]:
    """Stop an earlier attempt's supervisor and job group; return what was done."""
    notes: list[str] = []
    state = current_state(paths)
    supervisor_running = supervisor_alive(paths)
    pgid = (state or {}).get("job_pgid")
    job_running = lock_is_held(paths.attempt_file("job.lock")) or bool(pgid and supervisor_running and group_exists(pgid))
    if not (supervisor_running or job_running):
        return notes
    old = (state or {}).get("attempt_id")
    notes.append(f"stopping attempt {old} left running")
    if os.path.isdir(paths.attempt_dir):
        request_cancel(paths, reason, grace)
    if pgid:
        signal_group(pgid, signal.SIGTERM)
        if not wait_for(lambda: not group_exists(pgid), grace):
            signal_group(pgid, signal.SIGKILL)
            wait_for(lambda: not group_exists(pgid), 5.0)
    # Give the old supervisor a moment to flush its logs and write its status, then insist.
    if not wait_for(lambda: not supervisor_alive(paths), grace + 5.0):
        spid = (state or {}).get("supervisor_pid")
        if spid:
            signal_group(spid, signal.SIGKILL)  # the supervisor leads its own session and group
        wait_for(lambda: not supervisor_alive(paths), 5.0)
    if lock_is_held(paths.attempt_file("job.lock")) or supervisor_alive(paths):
        raise InfraError(f"could not stop attempt {old} left running on this worker")
    return notes



def remove_stale_libtpu_lockfile(path: str) -> str | None:
    """Remove the lockfile unless a process holds it (libtpu takes a POSIX lock; flock checked too)."""
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot open {path} to check it: {e.strerror}"
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return f"{path} is held by a running process; left in place"
        os.unlink(path)
        return f"removed stale {path}"
    except OSError as e:
        return f"cannot remove {path}: {e.strerror}"
    finally:
        os.close(fd)



def _already_here(paths: WorkerPaths, attempt_id: str) -> bool:
    """An earlier delivery of the same assignment prepared, launched or cancelled this attempt.

    A prepare that failed half-way (no `prepared`) is done again.
    """
    spec = read_json(paths.attempt_file("spec.json")) or {}
    if spec.get("attempt_id") != attempt_id:
        return False
    return any(os.path.exists(paths.attempt_file(name)) for name in ("prepared", "state.json", "cancel"))


def prepare(paths_home: str, spec_text: str) -> dict:
    try:
        spec = load_spec(spec_text)
    except SetupError as e:
        return {"ok": False, "kind": "setup", "reason": str(e)}
    paths = paths_for(paths_home, spec)
    try:
        if spec["job_dir"] != paths.job_dir:
            raise SetupError(f"spec JOB_DIR {spec['job_dir']!r} is not this worker's {paths.job_dir!r}")
        if _already_here(paths, spec["attempt_id"]):
            return {"ok": True, "already": True, "notes": []}
        notes = _prepare_workspace(paths, spec)
        return {"ok": True, "already": False, "notes": notes}
    except SetupError as e:
        return _ended_before_launch(spec, paths, "setup", str(e))
    except PreflightFailed as e:
        # Not the job's failure: the executor ends the attempt infra_failed and the slice is quarantined.
        return _ended_before_launch(spec, paths, "preflight", str(e))
    except InfraError as e:
        return {"ok": False, "kind": "infra", "reason": str(e)}
    except OSError as e:
        return {"ok": False, "kind": "infra", "reason": f"{e.__class__.__name__}: {e}"}


def _ended_before_launch(spec: dict, paths: WorkerPaths, phase: str, reason: str) -> dict:
    """The answer (and the status object: phase `setup` or `preflight`) of a prepare that found the attempt cannot
    run here."""
    try:
        publish_status(spec, build_status(spec, paths, phase=phase, **{f"{phase}_error": reason}),
                       deadline_seconds=60.0)
    except Exception as upload_error:  # noqa: BLE001
        reason += f" (and the status object could not be written: {upload_error})"
    return {"ok": False, "kind": phase, "reason": reason}


def _prepare_workspace(paths: WorkerPaths, spec: dict) -> list[str]:
    notes = stop_stale(paths, f"superseded by attempt {spec['attempt_id']}", float(spec.get("stale_grace_seconds", 10)))
    rmtree(paths.attempt_dir)
    rmtree(paths.job_dir)
    os.makedirs(paths.attempt_dir)
    os.makedirs(paths.job_dir)
    write_json_atomic(paths.attempt_file("spec.json"), spec)

    lock_note = remove_stale_libtpu_lockfile(paths.libtpu_lockfile)
    if lock_note:
        notes.append(lock_note)
    # What is still held now (the earlier attempt's processes are stopped) is another's: the host is unfit.
    run_preflight(spec, paths.libtpu_lockfile, (paths.home, paths.cache_root))

    caches = spec.get("caches") or []
    for cache in caches:
        key = cache.get("key", "")
        if not key or "/" in key or key in (".", ".."):
            raise SetupError(f"cache key {key!r} is not a plain name")
    try:
        notes += sort_caches(paths.cache_root, caches)
    except OSError as e:
        raise SetupError(f"cache directory {paths.cache_root}: {e.strerror or e}") from None

    bundle = spec.get("bundle")
    if bundle:
        notes.append(_fetch_bundle(paths, spec, bundle))

    for cache in caches:
        link_cache(paths.job_dir, cache["path"], os.path.join(paths.cache_root, cache["key"]))

    with open(paths.attempt_file("prepared"), "w") as f:
        f.write(spec["attempt_id"])
    return notes


def _fetch_bundle(paths: WorkerPaths, spec: dict, bundle: dict) -> str:
    gcs_cfg = spec["gcs"]
    gcs = Gcs(gcs_cfg["api_base"], gcs_cfg.get("token_url"))
    tar_path = paths.attempt_file("bundle.tar")
    where = f"gs://{bundle['bucket']}/{bundle['object']}"
    try:
        size = retry(
            lambda: gcs.download_to(bundle["bucket"], bundle["object"], tar_path),
            4,
            float(gcs_cfg.get("retry_delay_seconds", 0.5)),
            transient_gcs_error,
        )
    except GcsError as e:
        if e.status == 404:
            raise SetupError(f"bundle {where} does not exist") from None
        if e.status in (401, 403):
            raise SetupError(f"bundle {where} cannot be read: {e}") from None
        raise InfraError(f"bundle {where} could not be downloaded: {e}") from None
    try:
        count = extract_bundle(tar_path, paths.job_dir)
    finally:
        os.unlink(tar_path)
    return f"bundle {where}: {size} bytes, {count} entries"
