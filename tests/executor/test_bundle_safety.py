"""The bundle check the worker runs before extracting anything."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from tpuq.executor.worker.bundle import UnsafeBundle, check_bundle_members, extract_bundle


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", data: bytes = b"") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data


def _tar(tmp_path, *members: tuple) -> str:
    path = tmp_path / "bundle.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return str(path)


def _check(*members: tuple) -> list[str]:
    return [m.name for m in check_bundle_members([info for info, _ in members])]


def test_ordinary_bundle_passes_and_skips_the_root_entry():
    names = _check(
        _member("./", tarfile.DIRTYPE),
        _member("./train.py", data=b"print(1)"),
        _member("./lib", tarfile.DIRTYPE),
        _member("./lib/util.py"),
        _member("./latest", tarfile.SYMTYPE, "lib/util.py"),
        _member("./up", tarfile.SYMTYPE, "lib/../train.py"),
        _member("./copy.py", tarfile.LNKTYPE, "lib/util.py"),
    )
    assert names == ["./train.py", "./lib", "./lib/util.py", "./latest", "./up", "./copy.py"]


@pytest.mark.parametrize(
    "members, reason",
    [
        ([_member("../evil")], "'..'"),
        ([_member("a/../../evil")], "'..'"),
        ([_member("/etc/passwd")], "absolute"),
        ([_member("link", tarfile.SYMTYPE, "/etc")], "absolute"),
        ([_member("link", tarfile.SYMTYPE, "../outside")], "outside"),
        ([_member("d", tarfile.DIRTYPE), _member("d/link", tarfile.SYMTYPE, "../../x")], "outside"),
        # Each link is lexically inside, but `m` is the root itself, so m/.. is its parent.
        ([_member("m", tarfile.SYMTYPE, "."), _member("l", tarfile.SYMTYPE, "m/..")], "outside"),
        # A file written through a symlink that leaves the bundle.
        ([_member("out", tarfile.SYMTYPE, "/tmp"), _member("out/x")], "absolute"),
        ([_member("hard", tarfile.LNKTYPE, "../../etc/passwd")], "'..'"),
        ([_member("hard", tarfile.LNKTYPE, "/etc/passwd")], "absolute"),
        ([_member("hard", tarfile.LNKTYPE, "missing.txt")], "regular file of the bundle"),
        # A hardlink through a symlink to outside the bundle.
        ([_member("s", tarfile.SYMTYPE, "/etc"), _member("hard", tarfile.LNKTYPE, "s/passwd")], "absolute"),
        ([_member("loop1", tarfile.SYMTYPE, "loop2"), _member("loop2", tarfile.SYMTYPE, "loop1"),
          _member("loop1/x")], "too many symlinks"),
        ([_member("dev", tarfile.CHRTYPE)], "device"),
        ([_member("fifo", tarfile.FIFOTYPE)], "device"),
        ([_member("a"), _member("./a", tarfile.SYMTYPE, "/etc")], "twice"),
    ],
)
def test_unsafe_members_are_refused(members, reason):
    with pytest.raises(UnsafeBundle, match=reason):
        _check(*members)


def test_extract_writes_files_and_strips_setuid(tmp_path):
    setuid = _member("tool", data=b"#!/bin/sh\n")
    setuid[0].mode = 0o4755
    tar = _tar(tmp_path, _member("src", tarfile.DIRTYPE), _member("src/a.txt", data=b"hello"), setuid,
               _member("link", tarfile.SYMTYPE, "src/a.txt"))
    dest = tmp_path / "job"
    dest.mkdir()
    assert extract_bundle(tar, str(dest)) == 4
    assert (dest / "src/a.txt").read_bytes() == b"hello"
    assert os.readlink(dest / "link") == "src/a.txt"
    assert (dest / "tool").stat().st_mode & 0o7777 == 0o755


def test_extract_of_an_unsafe_bundle_writes_nothing(tmp_path):
    tar = _tar(tmp_path, _member("fine.txt", data=b"x"), _member("escape", tarfile.SYMTYPE, "../../x"))
    dest = tmp_path / "job"
    dest.mkdir()
    with pytest.raises(UnsafeBundle):
        extract_bundle(tar, str(dest))
    assert list(dest.iterdir()) == []
