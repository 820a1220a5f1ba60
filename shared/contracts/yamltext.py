"""Reading a job or fleet file's YAML, the same way at every entry point (`tpuq validate`/`submit`, `tpuq fleet
apply`, an uploaded job file), and saying what is wrong with it the same way.

A key given twice in one mapping is refused: YAML says keys are unique (https://yaml.org/spec/1.2.2/#mapping), but
PyYAML's `safe_load` keeps the last one silently, so a job with `command:` twice would run the second without a
word. A merge (`<<: *defaults`) may still be overridden by the mapping's own keys, as YAML intends.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_document(self, node):
        # Checked on the composed document, before any mapping is built: building one flattens its merges into the
        # merged nodes themselves, after which a merged key and the mapping's own override would look like twins.
        _refuse_duplicate_keys(node)
        return super().construct_document(node)


def _refuse_duplicate_keys(root) -> None:
    seen_nodes: set[int] = set()  # an anchored node is reached once per alias: checked once
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                todo.append(value_node)
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue  # a merge may be overridden; a complex key is left to safe_load
                key = (key_node.tag, key_node.value)  # `a` and 'a' are one key, `1` and "1" two
                if key in keys:
                    raise ConstructorError("while constructing a mapping", node.start_mark,
                                           f"found the key {key_node.value!r} twice in one mapping",
                                           key_node.start_mark)
                keys.add(key)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing a key given twice in one mapping (yaml.YAMLError, with its line)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def error_text(e: yaml.YAMLError) -> str:
    """`not valid YAML at line 3, column 7: ...`: where and what."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"not valid YAML{where}: {getattr(e, 'problem', None) or e}"
