"""Pub/Sub subscription filters, which the emulator stores but never applies: the local front
(tpuq_dev.devstack.front) and the simulator's bus (tpuq_dev.simulate.bus) apply them with this.

What Google does (https://cloud.google.com/pubsub/docs/subscription-message-filter):
- A subscription's `filter` selects messages by their attributes only. A message it does not match is
  acknowledged by Pub/Sub itself and never delivered: a push subscription's endpoint never sees it.
- The language: `attributes:KEY` (the key is present), `attributes.KEY = "v"` and `!= "v"`, `hasPrefix(
  attributes.KEY, "p")`, joined by `AND`, `OR` and `NOT` (or `-`) with parentheses. A key other than letters,
  digits, `_` and `-` is written as a string literal. Keys and values are case-sensitive and match exactly.
- At most 256 bytes; the filter is set when the subscription is created and can never be changed
  (the emulator says so too: "Updating the filter field is currently unsupported").

What the emulator does instead (shared reference, local-stack facts; measured again 2026-12-05): it stores any
text as a filter, even one Pub/Sub would refuse, returns it on GET, and delivers every message. So the front reads
each subscription's filter and applies it here; a filter this parser refuses is one Pub/Sub would refuse at
creation, and the front then delivers nothing on that subscription, loudly, rather than everything (the simulator
refuses to start).

Stricter than Google where the page is not explicit: `AND` and `OR` in one expression need parentheses.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping

MAX_FILTER_BYTES = 256

Attributes = Mapping[str, str]
Predicate = Callable[[Attributes], bool]


class FilterError(ValueError):
    """A filter Pub/Sub refuses: INVALID_ARGUMENT at the subscription's creation."""


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<op>!=|=|:|\(|\)|,|\.|-)
    | (?P<word>[A-Za-z0-9_-]+)
    )""", re.VERBOSE)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at, end = [], 0, len(text.rstrip())
    while at < end:
        m = _TOKEN.match(text, at)
        if not m:
            raise FilterError(f"unexpected {text[at:].strip()[:20]!r} at {at}")
        kind = m.lastgroup
        value = m.group(kind)
        out.append((kind, _unquote(value) if kind == "string" else value))
        at = m.end()
    return out


def _unquote(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            wanted = value or kind
            raise FilterError(f"expected {wanted!r}, found {token[1] if token else 'the end'!r}")
        self.at += 1
        return token[1]

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token is not None and token == ("word", word)

    def expression(self) -> Predicate:
        first = self.unary()
        joiner = None
        terms = [first]
        while self.is_word("AND") or self.is_word("OR"):
            word = self.take("word")
            if joiner not in (None, word):
                raise FilterError("AND and OR together need parentheses")
            joiner = word
            terms.append(self.unary())
        if joiner is None:
            return first
        if joiner == "AND":
            return lambda a: all(t(a) for t in terms)
        return lambda a: any(t(a) for t in terms)

    def unary(self) -> Predicate:
        if self.is_word("NOT") or self.peek() == ("op", "-"):
            self.at += 1
            inner = self.unary()
            return lambda a: not inner(a)
        if self.peek() == ("op", "("):
            self.at += 1
            inner = self.expression()
            self.take("op", ")")
            return inner
        if self.is_word("hasPrefix"):
            self.at += 1
            self.take("op", "(")
            self.take("word", "attributes")
            self.take("op", ".")
            key = self.key()
            self.take("op", ",")
            prefix = self.take("string")
            self.take("op", ")")
            return lambda a: key in a and a[key].startswith(prefix)
        self.take("word", "attributes")
        token = self.peek()
        if token == ("op", ":"):
            self.at += 1
            key = self.key()
            return lambda a: key in a
        self.take("op", ".")
        key = self.key()
        op = self.peek()
        if op not in (("op", "="), ("op", "!=")):
            raise FilterError(f"expected = or != after attributes.{key}")
        self.at += 1
        value = self.take("string")
        if op[1] == "=":
            return lambda a: a.get(key) == value
        return lambda a: key in a and a[key] != value

    def key(self) -> str:
        token = self.peek()
        if token is None or token[0] not in ("word", "string"):
            raise FilterError("expected an attribute key")
        self.at += 1
        return token[1]


def compile_filter(text: str) -> Predicate:
    """The predicate `text` stands for; an empty filter matches every message. FilterError as Pub/Sub refuses."""
    if len(text.encode()) > MAX_FILTER_BYTES:
        raise FilterError(f"{len(text.encode())} bytes: a filter is at most {MAX_FILTER_BYTES}")
    if not text.strip():
        return lambda attributes: True
    parser = _Parser(_tokens(text))
    predicate = parser.expression()
    if parser.peek() is not None:
        raise FilterError(f"unexpected {parser.peek()[1]!r} after the expression")
    return predicate


@functools.lru_cache(maxsize=256)
def compiled_filter(text: str) -> Predicate:
    """`compile_filter`, once per text: the front asks for every message (a refused text raises each time)."""
    return compile_filter(text)
