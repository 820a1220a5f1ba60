"""Deterministic job bundles: the same directory always gives the same bytes and the same sha256.

Entries are sorted; mtimes, owners and permissions are normalised; gzip's own
timestamp is zeroed. `.tpuqignore` (gitignore syntax, via pathspec) excludes
files; so does tpu-runner's `.tpu-runnerignore`, with tpu-runner's rule (below).
When both exist a path is left out if either excludes it. `.git/` and
`__pycache__/` are always left out. The bundle is named by
its content: `tpuq/bundles/<sha256>.tar.gz`, so an upload with a
does-not-exist precondition happens once per content and bucket.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILE = ".tpuqignore"
RUNNER_IGNORE_FILE = ".tpu-runnerignore"
ALWAYS_IGNORED = [".git/", "__pycache__/", ".tpuq-dev/", ".venv/"]
MAX_BUNDLE_BYTES = 2 * 1024**3


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    files: int
    ignore_files: tuple[str, ...] = ()  # the ignore files that applied, e.g. (".tpuqignore", ".tpu-runnerignore")

    @property
    def object_name(self) -> str:
        return f"tpuq/bundles/{self.sha256}.tar.gz"


def runner_ignores(relative: str, patterns: list[str]) -> bool:
    """tpu-runner 0.1.12's `.tpu-runnerignore` rule: a pattern without '/' is matched (fnmatch, case-sensitive)
    against every component of the path, so it excludes at any depth; one with '/' (leading and trailing '/'
    dropped) against the whole path from the bundle root, where '*' also crosses '/'. No negation."""
    parts = relative.split("/")
    for raw in patterns:
        pattern = raw.strip("/")
        if not pattern:
            continue
        if "/" in pattern:
            if fnmatch.fnmatchcase(relative, pattern):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


@dataclass(frozen=True)
class _Ignore:
    spec: pathspec.PathSpec
    runner_patterns: list[str]
    files: tuple[str, ...]

    def excludes(self, relative: str, is_dir: bool) -> bool:
        if self.spec.match_file(f"{relative}/" if is_dir else relative):
            return True
        return runner_ignores(relative, self.runner_patterns)


def _ignore_spec(root: Path) -> _Ignore:
    lines = list(ALWAYS_IGNORED)
    files = []
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        lines += ignore.read_text().splitlines()
        files.append(IGNORE_FILE)
    runner: list[str] = []
    runner_file = root / RUNNER_IGNORE_FILE
    if runner_file.is_file():
        runner = [line for raw in runner_file.read_text().splitlines()
                  if (line := raw.strip()) and not line.startswith("#")]
        files.append(RUNNER_IGNORE_FILE)
    return _Ignore(pathspec.GitIgnoreSpec.from_lines(lines), runner, tuple(files))


def _members(root: Path, ignore: _Ignore) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        # Prune ignored directories so that huge ignored trees are never walked.
        dirnames[:] = sorted(d for d in dirnames if not ignore.excludes((rel_dir / d).as_posix(), is_dir=True))
        for name in dirnames + filenames:
            rel = rel_dir / name
            is_dir = name in dirnames
            if not is_dir and ignore.excludes(rel.as_posix(), is_dir=False):
                continue
            out.append(rel)
    return sorted(out, key=lambda p: p.as_posix())


def make_bundle(directory: Path) -> Bundle:
    root = directory.resolve()
    if not root.is_dir():
        raise BundleError(f"bundle: {directory} is not a directory")
    ignore = _ignore_spec(root)
    raw = io.BytesIO()
    files = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in _members(root, ignore):
            path = root / rel
            st = path.lstat()
            info = tarfile.TarInfo(rel.as_posix())
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                resolved = (path.parent / target).resolve()
                if os.path.isabs(target) or root not in (resolved, *resolved.parents):
                    raise BundleError(f"bundle: symlink {rel} points outside the bundle ({target})")
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mode = 0o777
                tar.addfile(info)
            elif stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                files += 1
            # sockets, fifos and devices are not job content: skipped
            if raw.tell() > MAX_BUNDLE_BYTES:
                raise BundleError(f"bundle: {directory} is larger than {MAX_BUNDLE_BYTES // 1024**3} GiB; "
                                  f"exclude data with {IGNORE_FILE} or {RUNNER_IGNORE_FILE}")
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    data = compressed.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=files, ignore_files=ignore.files)
