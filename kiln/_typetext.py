"""Reading type text: the tokens one at a time, and what one parse may build.

The parser itself (:func:`kiln._types.parse_type`) builds types as it reads;
everything here bounds it before it builds: :class:`Tokens` reads one token
at a time and refuses the token past :data:`MAX_TOKENS`, :func:`count_tokens`
refuses long text before any of it is parsed, and :class:`Budget` sums what
every container of one parse holds (each keeps its own copy of its text).
"""

import re

from ._errors import KilnError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# the longest type text, in tokens and in characters: far past any real schema,
# far below memory (a type built by reuse, a JSON Schema's $defs, can double at
# each level: its tokens and characters are counted before it is built)
MAX_TOKENS = 1_000_000
MAX_TEXT = 16_000_000
# and what one parse (of type text or a JSON Schema) may build in all, summed
# over the containers it builds (each holds its own copy of its text)
MAX_BUILT = 8 * MAX_TOKENS
MAX_BUILT_TEXT = 4 * MAX_TEXT

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
