"""The ``kiln`` command's parser (argparse): every command's options and help.

``kiln/cli.py``'s ``main`` builds it for every command line but the bare
``kiln inspect FILE`` and ``kiln check FILE``, which go to their command
without it (argparse, gettext, locale and the parser are about a quarter of
what such a command adds to ``import numpy``).
"""

import argparse
import os
import sys
from typing import Any, Optional

from .common import RUNNERS

EPILOG = """examples:
  kiln demo                              save, open and check a sample model
  kiln inspect model.kiln                the tensor table and the metadata
  kiln inspect rec.kiln --type 'struct{id:i64,batch:tensors}'
  kiln check model.kiln                  exit 0 when valid, else code, offset, reason
  kiln convert model.safetensors model.kiln     also .gguf and .npz in, .safetensors
  kiln convert model.kiln model.npz              and .npz out
  kiln inspect data.kilnr                a record file: count, type hash, index
  kiln check data.kilnr --type TEXT      every record read and checked
  kiln convert data.jsonl data.kilnr --schema schema.json    and back to .jsonl
  kiln cases                             the golden cases that ship with kiln
  kiln gen schema.json -o records.py     dataclasses from a JSON Schema
  kiln hash 'struct{id:i64,name:str}'    canonical text and schema hash

exit codes: 0 ok, 1 invalid, foreign or unconvertible input or a failed case,
  2 usage or I/O error, 130 interrupted, 141 stdout closed (kiln ... | head)"""



FILE_HELP = "a path or a URL (http(s)://, s3://, file://)"

INSPECT = """Print what a file is and what it holds, without decoding more than that:

  .kiln (tensor directory)  the header, the tensor table (name, dtype, shape, offset,
                            bytes, layout, quantization) and the metadata
  framed record             the type hash in its frame; with --type, the value
  bare value                needs --type TEXT: the value, decoded
  .kilnr (record file)      the record count, the type hash, where the index is
                            (or, with --recover, where a torn file's records end)
  a sharded set             its index (*.kiln.index.json) or folder: each shard's
                            tensor count and size, one table with a shard column

Exit 1 when the file is invalid or foreign, or --type does not match it."""

CHECK = """Check a whole file and exit 0 when it is valid, 1 with the code, the byte offset
and the reason when it is not:

  .kiln     the structure (header, table, names, alignment, gaps), the payload
            rules, and the CRC-32 of each tensor when the file records them
  .kilnr    every record's frame and checksum, the index and trailer; with
            --type, every record decoded as that type
  a record  with --type (and --framed for a framed one): decoded in full"""

CONVERT = """Convert SRC to DST, each format named by its file's extension:

  .safetensors -> .kiln       .kiln -> .safetensors
  .gguf        -> .kiln       (quantized blocks kept as they are, layout ggml.<TYPE>)
  .npz         -> .kiln       .kiln -> .npz
  sharded sets, by their index:
  .safetensors.index.json -> .kiln.index.json    each shard converted beside it
  .kiln.index.json -> .safetensors.index.json    and back
  .safetensors.index.json or .kiln.index.json -> .kiln    the set in one file
  .kiln        -> .kiln       with --checksum: checksums added
  FOLDER       -> .kiln (or a .kiln.index.json)    a save_pretrained folder: its
                              one index (the set), else its one .safetensors file
  .jsonl       -> .kilnr      one record per line, with --type or --schema
  .kilnr       -> .jsonl      one line per record, as the type text the file stores
                              (--type or --schema for a file that stores none)

Tensors are streamed; DST is written to a temporary file beside it and
replaces it only when the conversion succeeds. Exit 1 for a source that
cannot be converted, 2 for a pair of formats with no converter."""


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it (``COLUMNS``,
    else the terminal on stdout, else 80), without importing shutil: argparse
    builds a formatter for every argument it adds, and shutil brings bz2, lzma
    and fnmatch into every start of the command."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, its default width found by :func:`_columns`."""

    def __init__(self, prog: str, **options: Any) -> None:
        if options.get("width") is None:
            options["width"] = _columns() - 2   # argparse's own margin
        super().__init__(prog, **options)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The same, with descriptions and the epilog printed as written."""


class _Version(argparse.Action):
    """``kiln --version``: the version, the kernels this process imported, and whether
    the compiled tensor layer is on (kiln is imported only when asked)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        import kiln
        from kiln._access import compiled_tensor_part_bound   # the part that serves
        print("kiln %s, %s kernels, compiled tensor layer %s"
              % (kiln.__version__, kiln.IMPLEMENTATION,
                 "on" if compiled_tensor_part_bound() else "off"))
        parser.exit()


def _add_demo(sub: Any) -> None:
    c = sub.add_parser("demo", help="save, open and check a sample model; timings",
                       formatter_class=_Formatter)
    c.add_argument("--out", help="where to save the sample (default: sample.kiln in a new "
                   "temporary folder, kept and printed)")
    c.set_defaults(fn=RUNNERS["demo"])


def _file_command(sub: Any, name: str, summary: str, description: str, type_help: str,
                  option: str, option_help: str, recover_help: str) -> None:
    """``kiln inspect`` or ``kiln check``: FILE, --type, the command's own flag,
    --recover."""
    c = sub.add_parser(name, help=summary, description=description,
                       formatter_class=_RawFormatter)
    c.add_argument("file", help=FILE_HELP)
    c.add_argument("--type", metavar="TEXT", help=type_help)
    c.add_argument(option, action="store_true", help=option_help)
    c.add_argument("--recover", action="store_true", help=recover_help)
    c.set_defaults(fn=RUNNERS[name])


def _add_inspect(sub: Any) -> None:
    _file_command(
        sub, "inspect", "what a file is: header, tensor table, metadata", INSPECT,
        "the type text to decode a record (a bare or framed value) as; for a record file "
        "(.kilnr), the type its records are checked against",
        "--json", "the report as JSON on stdout (for scripts)",
        "a torn record file (a writer killed or failed): report its complete records and "
        "where they end")


def _add_check(sub: Any) -> None:
    _file_command(
        sub, "check", "exit 0 when the file is valid", CHECK,
        "check as a value of this type text (a record); for a record file (.kilnr), also "
        "decode every record as it",
        "--framed", "with --type: the value has the 16-byte frame (magic and type hash)",
        "a torn record file: check its complete records, say where they end (the exit "
        "status is still 1: the file is torn)")


def _add_convert(sub: Any) -> None:
    raw = _RawFormatter
    c = sub.add_parser("convert", help="convert between .kiln, .safetensors, .gguf and .npz; "
                       ".jsonl and .kilnr", description=CONVERT, formatter_class=raw)
    c.add_argument("src", help="the file to read, its format its extension; or a folder "
                               "as save_pretrained writes it")
    c.add_argument("dst", help="the file to write (replaced whole, only once the conversion "
                               "has succeeded); its format is its extension")
    c.add_argument("--schema", metavar="FILE",
                   help="a JSON Schema file giving the record type (.jsonl <-> .kilnr)")
    c.add_argument("--type", metavar="TEXT",
                   help="the record type as type text (.jsonl -> .kilnr; .kilnr -> .jsonl "
                        "when the file stores no type text)")
    c.add_argument("--checksum", action="store_true",
                   help="record a CRC-32 of every tensor in a .kiln destination")
    c.add_argument("--round-floats", action="store_true",
                   help=".jsonl -> .kilnr: round numbers an f32 or f64 field cannot hold "
                        "exactly (0.1 as f32) to the nearest, instead of refusing them")
    c.set_defaults(fn=RUNNERS["convert"])


def _add_cases(sub: Any) -> None:
    c = sub.add_parser("cases", help="run the golden cases against the active implementation",
                       formatter_class=_Formatter)
    c.add_argument("file", nargs="?", help="case file (default: the cases shipped with kiln)")
    c.add_argument("-v", "--verbose", action="store_true")
    c.set_defaults(fn=RUNNERS["cases"])


def _add_gen(sub: Any) -> None:
    c = sub.add_parser("gen", help="a module of dataclasses from a JSON Schema",
                       formatter_class=_Formatter)
    c.add_argument("schema")
    c.add_argument("-o", "--output", help="module path (default: stdout)")
    c.add_argument("--root", help="the root class's name (default: the title, or Root)")
    c.set_defaults(fn=RUNNERS["gen"])


def _add_hash(sub: Any) -> None:
    c = sub.add_parser("hash", help="print the canonical text and schema hash of a type",
                       formatter_class=_Formatter)
    c.add_argument("type_text")
    c.set_defaults(fn=RUNNERS["hash"])

COMMANDS = {"demo": _add_demo, "inspect": _add_inspect, "check": _add_check,
            "convert": _add_convert, "cases": _add_cases, "gen": _add_gen, "hash": _add_hash}


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command ``only`` alone (what
    ``main`` builds when the first argument names a command: ``kiln inspect``
    pays for one subparser)."""
    p = argparse.ArgumentParser(prog="kiln", description="Kiln wire format tools",
                                epilog=EPILOG, formatter_class=_RawFormatter)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the version and the kernels in use, then exit")
    # (prog given: argparse would otherwise format a usage line to find "kiln")
    sub = p.add_subparsers(dest="cmd", required=True, prog=p.prog)
    for name, add in COMMANDS.items():
        if only is None or name == only:
            add(sub)
    return p
