"""Job and fleet files are read one way everywhere (`tpuq.contracts.yamltext`): a key given twice in one mapping is
refused with its line (PyYAML alone keeps the last, so a job would run its second `command:` without a word), while
a merge (`<<: *defaults`) is still overridden by the mapping's own keys."""

from __future__ import annotations

import pytest
import yaml

from tpuq.contracts import yamltext


def test_a_key_given_twice_is_refused_with_where():
    with pytest.raises(yaml.YAMLError) as refused:
        yamltext.load("jobs:\n  - tpu: v4-8\n    command: echo first\n    command: echo second\n")
    assert yamltext.error_text(refused.value) == \
        "not valid YAML at line 4, column 5: found the key 'command' twice in one mapping"


def test_a_nested_or_flow_mapping_is_checked_too():
    with pytest.raises(yaml.YAMLError, match="'pip' twice"):
        yamltext.load("env: {A: '1'}\ncaches: {pip: a, pip: b}\n")


def test_a_merge_is_overridden_by_the_mappings_own_keys():
    data = yamltext.load("jobs:\n  - &d\n    tpu: v4-8\n    command: a\n  - <<: *d\n    command: b\n")
    assert data["jobs"][1] == {"tpu": "v4-8", "command": "b"}


def test_a_merged_mapping_built_after_it_was_merged_elsewhere_is_no_duplicate():
    """`x` merges `gpu`, which merges `base` and overrides A: building `x` first flattens `gpu`'s node in place."""
    text = 'base: &b {A: "1"}\nenvs: {gpu: &g {<<: *b, A: "2"}}\nx: {<<: *g}\n'
    assert yamltext.load(text) == yaml.safe_load(text)
    assert yamltext.load(text)["x"] == {"A": "2"}


def test_a_quoted_and_a_plain_key_are_one_key_a_number_and_its_text_two():
    with pytest.raises(yaml.YAMLError, match="'a' twice"):
        yamltext.load("a: 1\n'a': 2\n")
    assert yamltext.load("1: x\n'1': y\n") == {1: "x", "1": "y"}


def test_anything_else_reads_as_safe_load_reads_it():
    text = "a: 1\nb: [x, {c: 2}]\nd: null\ne: 2026-12-05\n"
    assert yamltext.load(text) == yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError):
        yamltext.load("!!python/object:os.system {}")  # still safe
