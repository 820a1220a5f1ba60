"""Bundles are deterministic, honour .tpuqignore, and refuse links that leave the directory."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from tpuq.contracts.bundle import BundleError, make_bundle


def write(root, rel, text="x"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(bundle):
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        return [m.name for m in tar.getmembers()]


def test_same_content_same_bytes_regardless_of_mtime_and_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, order in ((a, ["z.py", "m/x.py", "a.txt"]), (b, ["a.txt", "m/x.py", "z.py"])):
        for rel in order:
            write(root, rel, rel)
    os.utime(a / "z.py", (1, 1))
    first, second = make_bundle(a), make_bundle(b)
    assert first.sha256 == second.sha256 and first.data == second.data
    assert names(first) == sorted(names(first))
    assert first.object_name == f"tpuq/bundles/{first.sha256}.tar.gz"


def test_tpuqignore_and_always_ignored(tmp_path):
    write(tmp_path, "train.py")
    write(tmp_path, "data/big.bin")
    write(tmp_path, "logs/run.log")
    write(tmp_path, ".git/config")
    write(tmp_path, "pkg/__pycache__/m.pyc")
    write(tmp_path, ".tpuqignore", "data/\n*.log\n")
    got = names(make_bundle(tmp_path))
    assert "train.py" in got and ".tpuqignore" in got
    assert not any(n.startswith(("data", ".git")) or n.endswith((".log", ".pyc")) for n in got)


def test_content_change_changes_hash(tmp_path):
    write(tmp_path, "a.py", "1")
    one = make_bundle(tmp_path).sha256
    write(tmp_path, "a.py", "2")
    assert make_bundle(tmp_path).sha256 != one


def test_symlink_inside_is_kept_and_outside_refused(tmp_path):
    write(tmp_path, "real.py")
    (tmp_path / "link.py").symlink_to("real.py")
    assert "link.py" in names(make_bundle(tmp_path))
    (tmp_path / "escape").symlink_to("/etc/passwd")
    with pytest.raises(BundleError, match="outside"):
        make_bundle(tmp_path)


def test_not_a_directory(tmp_path):
    with pytest.raises(BundleError, match="not a directory"):
        make_bundle(tmp_path / "missing")
