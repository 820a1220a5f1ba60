"""`.tpu-runnerignore` is honoured with tpu-runner 0.1.12's rule, alongside `.tpuqignore` (issue 15 §3)."""

from __future__ import annotations

import io
import tarfile

import pytest

from tpuq.contracts.bundle import make_bundle, runner_ignores

FILES = ["train.py", "secret.env", "conf/prod.env", "data/a/b.bin", "data/c.bin", "logs/x.txt", "src/logs/y.txt",
         "!keep.env", "notes.log", "secrets/key.pem", "deep/secrets/key.pem", "Secret.ENV"]


def tree(root, ignores: dict[str, str]):
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    for name, text in ignores.items():
        (root / name).write_text(text)


def bundled_files(bundle) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        return {m.name for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("pattern, excluded", [
    ("*.env", {"secret.env", "conf/prod.env", "!keep.env"}),  # no '/': any component, at any depth; case-sensitive
    ("data/*.bin", {"data/a/b.bin", "data/c.bin"}),  # with '/': the whole path, and '*' crosses '/' (gitignore's would not)
    ("/logs/", {"logs/x.txt", "src/logs/y.txt"}),  # slashes dropped: then a component, so any depth
    ("secrets", {"secrets/key.pem", "deep/secrets/key.pem"}),  # a directory: everything under it
    ("!keep.env", {"!keep.env"}),  # no negation: the '!' is part of the name
    ("# *.env", set()),  # a comment
])
def test_tpu_runner_rule(tmp_path, pattern, excluded):
    tree(tmp_path, {".tpu-runnerignore": pattern + "\n"})
    bundle = make_bundle(tmp_path)
    assert set(FILES) - bundled_files(bundle) == excluded
    assert bundle.ignore_files == (".tpu-runnerignore",)


def test_both_ignore_files_apply_and_neither_can_bring_back_what_the_other_leaves_out(tmp_path):
    tree(tmp_path, {".tpuqignore": "*.log\n!secrets/\n!secret.env\n", ".tpu-runnerignore": "secret*\n"})
    bundle = make_bundle(tmp_path)
    assert set(FILES) - bundled_files(bundle) == {"notes.log", "secret.env", "secrets/key.pem",
                                                  "deep/secrets/key.pem"}
    assert bundle.ignore_files == (".tpuqignore", ".tpu-runnerignore")


def test_no_ignore_file(tmp_path):
    tree(tmp_path, {})
    bundle = make_bundle(tmp_path)
    assert bundled_files(bundle) == set(FILES) and bundle.ignore_files == ()


def test_rule_on_paths():
    assert runner_ignores("a/b/c.py", ["a/*.py"]) and not runner_ignores("b/a/c.py", ["a/*.py"])
    assert not runner_ignores("x.txt", ["", "/"])
