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
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue  # an unhashable key: safe_load's own error says so
                if duplicate:
                    raise ConstructorError("while constructing a mapping", node.start_mark,
                                           f"found the key {key!r} twice in one mapping", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing a key given twice in one mapping (yaml.YAMLError, with its line)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def error_text(e: yaml.YAMLError) -> str:
    """`not valid YAML at line 3, column 7: ...`: where and what."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"not valid YAML{where}: {getattr(e, 'problem', None) or e}"
