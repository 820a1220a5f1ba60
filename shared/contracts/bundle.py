"""Deterministic job bundles: the same directory always gives the same bytes and the same sha256.

Entries are sorted; mtimes, owners and permissions are normalised; gzip's own
timestamp is zeroed. `.tpuqignore` (gitignore syntax, via pathspec) excludes
files; so does tpu-runner's `.tpu-runnerignore`, with tpu-runner's rule (below).
When both exist a path is left out if either excludes it. `.git/` and
`__pycache__/` are always left out. The bundle is named by
its content: `tpuq/bundles/<sha256>.tar.gz`, so an upload with a
does-not-exist precondition happens once per content and bucket.

The tarball is written as a stream (`write_bundle`: tar, then gzip, then the sink, hashed on the way), from
members that open their content only when they are packed: a directory's files (`make_bundle`), or a bucket
folder's objects (`object_members`, which tpuq.scheduler.folder_bundle streams from GCS into GCS), so the same
content gives the same bytes either way and nothing needs the whole tarball in memory.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import pathspec

IGNORE_FILE = ".tpuqignore"
RUNNER_IGNORE_FILE = ".tpu-runnerignore"
ALWAYS_IGNORED = [".git/", "__pycache__/", ".tpuq-dev/", ".venv/"]
MAX_BUNDLE_BYTES = 2 * 1024**3
COPY_BYTES = 1024**2  # a file's content goes into the tar this much at a time


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
        return bundle_object_name(self.sha256)


def bundle_object_name(sha256: str) -> str:
    """Where a bundle is stored in a bucket: named by its content."""
    return f"tpuq/bundles/{sha256}.tar.gz"


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


def ignore_rules(tpuqignore: str | None, runnerignore: str | None) -> _Ignore:
    """The rules of a bundle root's `.tpuqignore` and `.tpu-runnerignore` (their text; None: the root has none)."""
    lines = list(ALWAYS_IGNORED)
    files = []
    if tpuqignore is not None:
        lines += tpuqignore.splitlines()
        files.append(IGNORE_FILE)
    runner: list[str] = []
    if runnerignore is not None:
        runner = [line for raw in runnerignore.splitlines() if (line := raw.strip()) and not line.startswith("#")]
        files.append(RUNNER_IGNORE_FILE)
    return _Ignore(pathspec.GitIgnoreSpec.from_lines(lines), runner, tuple(files))


def _ignore_spec(root: Path) -> _Ignore:
    def text(name: str) -> str | None:
        return (root / name).read_text() if (root / name).is_file() else None

    return ignore_rules(text(IGNORE_FILE), text(RUNNER_IGNORE_FILE))


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


@dataclass(frozen=True)
class Member:
    """One entry of a bundle: a directory, a symlink, or a file whose content `open` gives when it is packed."""

    path: str  # relative to the bundle's root, '/'-separated
    kind: str  # "dir", "symlink" or "file"
    size: int = 0
    executable: bool = False
    linkname: str = ""
    open: Callable[[], BinaryIO] | None = None


@dataclass(frozen=True)
class Packed:
    sha256: str
    size: int  # bytes of .tar.gz
    files: int


class BundleTooLarge(BundleError):
    def __init__(self, tar_bytes: int, limit: int):
        super().__init__(f"bundle: {tar_bytes} bytes of tar exceed {limit}")
        self.tar_bytes, self.limit = tar_bytes, limit


class _Digest(io.RawIOBase):
    """Where the .tar.gz goes: hashed and counted on the way to `out`."""

    def __init__(self, out: BinaryIO):
        self.out, self.sha256, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


def write_bundle(members: Iterable[Member], out: BinaryIO, limit: int = MAX_BUNDLE_BYTES) -> Packed:
    """Write the members as a deterministic .tar.gz to `out`, streaming: at most a few buffers are held at once.
    BundleTooLarge once the tar passes `limit` bytes."""
    sink = _Digest(out)
    files = 0
    with gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, filename="") as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_BYTES) as tar:
            for member in members:
                info = tarfile.TarInfo(member.path)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if member.kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = member.linkname
                    info.mode = 0o777
                    tar.addfile(info)
                elif member.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
                else:
                    assert member.open is not None
                    info.size = member.size
                    info.mode = 0o755 if member.executable else 0o644
                    with member.open() as f:
                        tar.addfile(info, f)
                    files += 1
                if gz.tell() > limit:
                    raise BundleTooLarge(gz.tell(), limit)
    return Packed(sink.sha256.hexdigest(), sink.size, files)


def _directory_members(root: Path, ignore: _Ignore) -> Iterable[Member]:
    for rel in _members(root, ignore):
        path = root / rel
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            resolved = (path.parent / target).resolve()
            if os.path.isabs(target) or root not in (resolved, *resolved.parents):
                raise BundleError(f"bundle: symlink {rel} points outside the bundle ({target})")
            yield Member(rel.as_posix(), "symlink", linkname=target)
        elif stat.S_ISDIR(st.st_mode):
            yield Member(rel.as_posix(), "dir")
        elif stat.S_ISREG(st.st_mode):
            yield Member(rel.as_posix(), "file", size=st.st_size, executable=bool(st.st_mode & stat.S_IXUSR),
                         open=lambda path=path: open(path, "rb"))
        # sockets, fifos and devices are not job content: skipped


def make_bundle(directory: Path) -> Bundle:
    root = directory.resolve()
    if not root.is_dir():
        raise BundleError(f"bundle: {directory} is not a directory")
    ignore = _ignore_spec(root)
    out = io.BytesIO()
    try:
        packed = write_bundle(_directory_members(root, ignore), out)
    except BundleTooLarge:
        raise BundleError(f"bundle: {directory} is larger than {MAX_BUNDLE_BYTES // 1024**3} GiB; "
                          f"exclude data with {IGNORE_FILE} or {RUNNER_IGNORE_FILE}") from None
    return Bundle(data=out.getvalue(), sha256=packed.sha256, files=packed.files, ignore_files=ignore.files)


def object_members(objects: Iterable[tuple[str, int, Callable[[], BinaryIO]]], ignore: _Ignore) -> list[Member]:
    """A bucket folder's objects (relative name, size, opener) as the members `make_bundle` gives for a directory
    holding those files: the same ignore rules (an ignored folder leaves out all beneath it), the folders the names
    imply, sorted the same way. Objects have no mode: no file is executable, as none downloaded is."""
    files: dict[str, Member] = {}
    folders: set[str] = set()
    for name, size, opener in objects:
        parts = PurePosixPath(name).parts
        if not parts or any(p in ("", ".", "..") for p in parts) or name.startswith("/"):
            continue
        ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if any(ignore.excludes(a, is_dir=True) for a in ancestors):
            continue
        folders.update(ancestors)
        if not ignore.excludes(name, is_dir=False):
            files[name] = Member(name, "file", size=size, open=opener)
    clash = sorted(folders & set(files))
    if clash:
        raise BundleError(f"bundle: {clash[0]!r} is both a file and a folder")
    members = list(files.values()) + [Member(f, "dir") for f in folders]
    return sorted(members, key=lambda m: m.path)
