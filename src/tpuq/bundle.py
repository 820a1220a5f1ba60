"""Deterministic job bundles: the same directory always gives the same bytes and the same sha256.

Entries are sorted; mtimes, owners and permissions are normalised; gzip's own
timestamp is zeroed. `.tpuqignore` (gitignore syntax, via pathspec) excludes
files; `.git/` and `__pycache__/` are always left out. The bundle is named by
its content: `tpuq/bundles/<sha256>.tar.gz`, so an upload with a
does-not-exist precondition happens once per content and bucket.
"""

from __future__ import annotations

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
ALWAYS_IGNORED = [".git/", "__pycache__/", ".tpuq-dev/", ".venv/"]
MAX_BUNDLE_BYTES = 2 * 1024**3


class BundleError(ValueError):
    pass


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    files: int

    @property
    def object_name(self) -> str:
        return f"tpuq/bundles/{self.sha256}.tar.gz"


def _ignore_spec(root: Path) -> pathspec.PathSpec:
    lines = list(ALWAYS_IGNORED)
    ignore = root / IGNORE_FILE
    if ignore.exists():
        lines += ignore.read_text().splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _members(root: Path, spec: pathspec.PathSpec) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        # Prune ignored directories so that huge ignored trees are never walked.
        dirnames[:] = sorted(d for d in dirnames if not spec.match_file(f"{(rel_dir / d).as_posix()}/"))
        for name in dirnames + filenames:
            rel = rel_dir / name
            is_dir = name in dirnames
            if not is_dir and spec.match_file(rel.as_posix()):
                continue
            out.append(rel)
    return sorted(out, key=lambda p: p.as_posix())


def make_bundle(directory: Path) -> Bundle:
    root = directory.resolve()
    if not root.is_dir():
        raise BundleError(f"bundle: {directory} is not a directory")
    spec = _ignore_spec(root)
    raw = io.BytesIO()
    files = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in _members(root, spec):
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
                                  f"exclude data with {IGNORE_FILE}")
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    data = compressed.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=files)
