"""Reading type text: :func:`parse_type`, the tokens one at a time, and what
one parse may build.

The parser builds types as it reads, and everything it builds is bounded
before it is built: :class:`Tokens` reads one token at a time and refuses
the token past :data:`MAX_TOKENS`, :func:`count_tokens` refuses long text
before any of it is parsed, and :class:`Budget` sums what every container
of one parse holds (each keeps its own copy of its text).
"""

import re
from typing import Union

from ._errors import KilnError
from ._typemodel import (MAX_BUILT, MAX_BUILT_TEXT, MAX_TEXT, MAX_TOKENS, SCALARS, Dict, List,
                         Opt, Struct, Type)
from ._wire import MAX_DEPTH

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# whitespace may stand between tokens and inside an opener ("list <"); the
# tokens themselves (and so .text and the hash) are canonical
_TOKEN = re.compile(r"\s*(?:(struct)\s*\{|(list|opt|dict)\s*<|([A-Za-z_][A-Za-z0-9_]*|[:,}>]))")
_SPACE = re.compile(r"\s*\Z")


class Tokens:
    """The tokens of type text, read one at a time: nothing is built for a token
    the parser has not reached, and the token after the ``MAX_TOKENS``-th is
    refused (``LIMIT``) at its offset, so text past the limit is never read."""

    __slots__ = ("text", "pos", "count", "ahead")

    def __init__(self, text):
        self.text = text
        self.pos = 0
        self.count = 0
        self.ahead = None

    def peek(self):
        """(token, offset) of the next token, or (None, len(text)) at the end."""
        if self.ahead is None:
            self.ahead = self._read()
        return self.ahead

    def take(self):
        got = self.peek()
        self.ahead = None
        return got

    def _read(self):
        text, pos = self.text, self.pos
        m = _TOKEN.match(text, pos)
        if m is None:
            if _SPACE.match(text, pos):
                self.pos = len(text)
                return None, len(text)
            at = pos
            while text[at].isspace():
                at += 1
            raise KilnError("TYPE", at, "unexpected character %r in type text" % text[at])
        self.pos = m.end()
        if m.group(1):
            tok, at = "struct{", m.start(1)
        elif m.group(2):
            tok, at = m.group(2) + "<", m.start(2)
        else:
            tok, at = m.group(3), m.start(3)
        self.count += 1
        if self.count > MAX_TOKENS:
            raise KilnError("LIMIT", at, "type text of more than %d tokens" % MAX_TOKENS)
        return tok, at

    def need(self, want):
        tok, at = self.take()
        if tok != want:
            raise KilnError("TYPE", at, "expected %r in type text" % want)


def field_name(toks, names):
    """Read ``name :`` of a struct field; a repeated name is refused at its offset."""
    name, at = toks.take()
    if name is None or not _IDENT.match(name):
        raise KilnError("TYPE", at, "expected a field name")
    if name in names:
        raise KilnError("TYPE", at, "field name %r repeats" % name)
    names.add(name)
    toks.need(":")
    return name


class Budget:
    """What one parse may build, summed over every container it builds: each
    ``Type`` holds its own tokens and text, so a type nested ``d`` deep costs
    about ``d`` times its text.  ``spend`` is called before a container is
    built and refuses (``LIMIT``) past :data:`MAX_BUILT` tokens or
    :data:`MAX_BUILT_TEXT` characters in all."""

    __slots__ = ("tokens", "chars", "exc")

    def __init__(self, exc=None):
        self.tokens = self.chars = 0
        self.exc = exc

    def spend(self, tokens, chars, at, where=None):
        """Spend on one container, or refuse it (and spend nothing)."""
        if tokens > MAX_TOKENS or chars > MAX_TEXT:
            what = "a type of more than %d tokens or %d characters" % (MAX_TOKENS, MAX_TEXT)
        elif self.tokens + tokens > MAX_BUILT or self.chars + chars > MAX_BUILT_TEXT:
            what = ("types of more than %d tokens or %d characters in all (each container "
                    "holds its own text)" % (MAX_BUILT, MAX_BUILT_TEXT))
        else:
            self.tokens += tokens
            self.chars += chars
            return
        if self.exc is not None:
            raise self.exc(where, "the schema describes " + what, "LIMIT")
        raise KilnError("LIMIT", at, "the type text describes " + what)


def count_tokens(text):
    """Refuse text of more than MAX_TOKENS tokens before parsing any of it (LIMIT at
    the first token past the limit, where the parser would say it); counting
    stops at the first character that is no token, which the parser reports."""
    count, end = 0, 0
    for m in _TOKEN.finditer(text):
        if m.start() != end:
            return
        end = m.end()
        count += 1
        if count > MAX_TOKENS:
            at = m.start(1) if m.group(1) else m.start(2) if m.group(2) else m.start(3)
            raise KilnError("LIMIT", at, "type text of more than %d tokens" % MAX_TOKENS)


# --- the parser ---------------------------------------------------------------

_OPENERS = ("list<", "opt<", "dict<", "struct{")


def parse_type(text: Union[str, Type]) -> Type:
    """Parse type text (``list<struct{id:i64,}>``) into a :class:`kiln.Type` whose
    ``.text`` is canonical; whitespace and a missing last comma are accepted.  Raises
    :class:`~kiln.KilnError` ``TYPE`` (bad token or syntax, a repeated field name at
    its offset), ``DEPTH`` (over 64 levels), ``LIMIT`` (over 1,000,000 tokens, found
    while reading, before the rest is read), and ``TypeError`` for a non-str:

    >>> kiln.parse_type("struct { id : i64 }").text
    'struct{id:i64,}'
    """
    if isinstance(text, Type):
        return text
    if not isinstance(text, str):
        raise TypeError("type text must be a str, not %s" % type(text).__name__)
    cached = _PARSE_CACHE.get(text)
    if cached is not None:
        return cached
    if len(text) > MAX_TOKENS:
        count_tokens(text)
    result = _parse(Tokens(text))
    if len(_PARSE_CACHE) < 1024:
        _PARSE_CACHE[text] = result
    return result


def _parse(toks):
    # iterative: no recursion, so a hostile nest cannot exhaust the stack
    stack = []   # frames: [opener, offset, fields, names] (fields, names: structs)
    budget = Budget()
    while True:
        # the start of one type
        tok, at = toks.take()
        if tok is None:
            raise KilnError("TYPE", at, "type text ends early")
        if len(stack) >= MAX_DEPTH and (tok in _OPENERS or tok == "tensors"):   # tensors: 1 level
            raise KilnError("DEPTH", at, "type nests more than %d containers" % MAX_DEPTH)
        if tok == "dict<":
            toks.need("str")
            toks.need(",")
        if tok in ("list<", "opt<", "dict<"):
            stack.append((tok, at, None, None))
            continue
        if tok == "struct{":
            if toks.peek()[0] == "}":
                toks.take()
                value = Struct(())
            else:
                names = set()
                stack.append((tok, at, [field_name(toks, names)], names))
                continue
        elif tok in SCALARS:
            value = SCALARS[tok]
        else:
            raise KilnError("TYPE", at, "unknown type token %r" % tok)
        # attach the finished value to the enclosing frames
        while stack:
            kind, opened, fields, names = stack[-1]
            if kind != "struct{":
                toks.need(">")
                stack.pop()
                extra = (4, 10) if kind == "dict<" else (2, len(kind) + 1)
                budget.spend(len(value.tokens) + extra[0], len(value.text) + extra[1], opened)
                value = (List if kind == "list<" else Opt if kind == "opt<" else Dict)(value)
                continue
            # the value completes the pending field; the last comma may be left out
            fields[-1] = (fields[-1], value)
            if toks.peek()[0] != "}":
                toks.need(",")
            if toks.peek()[0] == "}":
                toks.take()
                stack.pop()
                budget.spend(2 + sum(3 + len(t.tokens) for _, t in fields),
                             8 + sum(2 + len(n) + len(t.text) for n, t in fields), opened)
                value = Struct(fields)
                continue
            fields.append(field_name(toks, names))
            break
        else:
            tok, at = toks.peek()
            if tok is not None:
                raise KilnError("TYPE", at, "text continues after the type")
            return value


_PARSE_CACHE = {}
