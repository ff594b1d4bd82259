"""The ``kiln`` command (also ``python -m kiln``).

Exit codes, the same for every command (docs/cli.md): 0 success; 1 the
input is not what was asked for (an invalid or foreign file, a file that
cannot be converted, a failing case); 2 a usage error or a file that cannot
be read or written (I/O, a missing optional package); 130 interrupted; 141
(128 + SIGPIPE) stdout was closed by its reader (``kiln inspect f | head``).
Errors are one line on stderr, never a traceback.

This module holds ``main``; the parser is ``kiln/_cli/parser.py`` (argparse,
built for every command line but a bare ``kiln inspect FILE`` or ``kiln
check FILE``, which go straight to their command); the commands live in
``kiln/_cli/``, one module per kind of file (``tensors``, ``records``), the
demo, and the cases, hash and gen commands (``cases``), with what they share
in ``common``.  A command uses the public API, plus ``kiln._access`` where it
needs more.
"""

import os
import sys
from typing import TYPE_CHECKING, Any, List, Optional

from ._cli.common import (EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK, EXIT_PIPE, EXIT_USAGE,
                          RUNNERS, Fail)


if TYPE_CHECKING:
    import argparse
    from ._cli.cases import run_case
    from ._cli.demo import SAMPLE_TYPE, sample


def __getattr__(name: str) -> Any:   # the demo's and the cases' names, on first use
    if name in ("run_case",):
        from ._cli import cases
        return getattr(cases, name)
    if name in ("sample", "SAMPLE_TYPE"):
        from ._cli import demo
        return getattr(demo, name)
    raise AttributeError("module 'kiln.cli' has no attribute %r" % name)

__all__ = ["main", "build_parser", "Fail", "run_case", "sample", "SAMPLE_TYPE", "EXIT_OK",
           "EXIT_INVALID", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_PIPE"]


def build_parser(only: Optional[str] = None) -> "argparse.ArgumentParser":
    """The parser of every command, or of the command ``only`` alone (what
    ``main`` builds when the first argument names a command: ``kiln inspect``
    pays for one subparser); see ``kiln/_cli/parser.py``."""
    from ._cli.parser import build_parser as build
    return build(only)


# what argparse makes of a bare ``kiln inspect FILE`` or ``kiln check FILE``
# besides ``cmd``, ``file``, ``fn`` and ``version`` (--version's default): main
# makes it without the parser (tests/test_startup.py holds the two to the same
# namespace)
BARE = {"inspect": {"type": None, "json": False, "recover": False},
        "check": {"type": None, "framed": False, "recover": False}}


def _bare(words: List[str]) -> Any:
    """The namespace of ``[command, FILE]`` for a command of :data:`BARE` and
    a FILE that is no option, else None (the parser reads it)."""
    if len(words) != 2 or words[0] not in BARE or not isinstance(words[1], str) or \
            words[1].startswith("-"):
        return None
    import types
    return types.SimpleNamespace(version=None, cmd=words[0], file=words[1],
                                 fn=RUNNERS[words[0]], **BARE[words[0]])


def _check_type_text(args: Any) -> None:
    """Bad ``--type`` text is the command line's fault, never the file's: a
    usage error (exit 2) in every command, before any file is read."""
    text = getattr(args, "type", None)
    if isinstance(text, str):
        import kiln
        try:
            kiln.parse_type(text)
        except kiln.KilnError as e:
            raise Fail("--type %r: %s" % (text, e.reason), EXIT_USAGE) from None


def main(argv: Optional[List[str]] = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = _bare(words)
    if args is None:
        args = build_parser(words[0] if words and words[0] in RUNNERS else None).parse_args(words)
    try:
        try:
            _check_type_text(args)
            code = int(args.fn(args))
        except Fail as e:
            print("kiln %s: %s" % (args.cmd, e), file=sys.stderr)
            code = e.code
        sys.stdout.flush()   # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (kiln inspect f | head -1): the standard way,
        # Python's docs on SIGPIPE: stdout to devnull so the exit flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
