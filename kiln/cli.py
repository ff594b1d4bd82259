"""The ``kiln`` command (also ``python -m kiln``).

Exit codes, the same for every command (docs/cli.md): 0 success; 1 the
input is not what was asked for (an invalid or foreign file, a file that
cannot be converted, a failing case); 2 a usage error or a file that cannot
be read or written (I/O, a missing optional package); 130 interrupted; 141
(128 + SIGPIPE) stdout was closed by its reader (``kiln inspect f | head``).
Errors are one line on stderr, never a traceback.
"""

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

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

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141


class Fail(Exception):
    """A one-line error and an exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        Exception.__init__(self, message)
        self.code = code


# --- cases and hash -------------------------------------------------------------

def _cases_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "data", "kiln-v2-cases.json")


def run_case(case: Dict[str, Any], kiln: Any) -> Any:
    """Decode one golden case; return (ok, actual outcome, detail)."""
    buf = bytes.fromhex(case["hex"])
    try:
        t = kiln.parse_type(case["type"])
        value = kiln.decode(buf, t, frame=case["framed"])
    except kiln.KilnError as e:
        actual = "reject %s" % e.code
        expected = "reject %s" % case["error"] if case["result"] == "reject" else "accept"
        return actual == expected, actual, str(e)
    if case["result"] != "accept":
        return False, "accept", ""
    again = kiln.encode(value, t, frame=case["framed"])
    if again != buf:
        return False, "accept, re-encodes to different bytes", again.hex()
    return True, "accept", ""


def cmd_cases(args: Any) -> int:
    import json
    import kiln
    path = args.file or _cases_path()
    try:
        with open(path) as f:
            cases = json.load(f)["cases"]
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, e.strerror))
    except (ValueError, KeyError, TypeError):
        raise Fail("%s is not a Kiln case file (JSON with a \"cases\" list)" % path, EXIT_INVALID)
    failed = 0
    for case in cases:
        ok, actual, detail = run_case(case, kiln)
        if not ok:
            failed += 1
            exp = "accept" if case["result"] == "accept" else "reject %s" % case["error"]
            print("FAIL %s: expected %s, got %s %s" % (case["name"], exp, actual, detail))
        elif args.verbose:
            print("ok   %s: %s" % (case["name"], actual))
    print("implementation: %s" % kiln.IMPLEMENTATION)
    print("cases: %s" % path)
    print("%d passed, %d failed" % (len(cases) - failed, failed))
    return 1 if failed else 0


def cmd_hash(args: Any) -> int:
    import kiln
    try:
        t = kiln.parse_type(args.type_text)
    except kiln.KilnError as e:
        raise Fail("%s" % e)
    print(t.text)
    print("0x%016x" % t.schema_hash)
    return 0


# --- inspect and check -----------------------------------------------------------

def _about(path: str, e: Any) -> str:
    """``path: message`` for an error about ``path``, naming the file once (a
    message that names it already is kept as it is)."""
    text = str(e)
    return text if str(path) in text else "%s: %s" % (path, text)


def _head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of a regular file or a URL (one range request):
    a FIFO, a socket or a device is refused without waiting on it."""
    from .remote import head, is_url
    from ._paths import local_path
    path = local_path(path)
    if is_url(path):
        return head(path, n)[1]
    from ._local import read_head
    return read_head(path, n)


def _size(path: str) -> int:
    from .remote import head, is_url
    from ._paths import local_path
    path = local_path(path)
    if is_url(path):
        return head(path, 0)[0]
    from ._local import file_size
    return file_size(path)


def _is_url(path: str) -> bool:
    from .remote import is_url
    return is_url(path)


def _oserror(e: OSError) -> str:
    """An OSError as one line: its message, or the system's text for its errno."""
    return str(e.strerror or e)


def _read(fn: Any, path: str) -> Any:
    try:
        return fn(path)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, _oserror(e)))


def _kind(path: str) -> str:
    try:
        magic = _head(path, 4)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, _oserror(e)))
    except (ImportError, ValueError) as e:
        raise Fail("cannot read %s: %s" % (path, e), EXIT_USAGE)
    if magic == b"KLNT":
        return "directory"
    if magic == b"KLN0":
        return "framed"
    if not magic:
        raise Fail("%s is empty" % path, EXIT_INVALID)
    from ._paths import foreign_hint
    hint = foreign_hint(_head(path, 16))
    if hint is not None:
        raise Fail("%s: %s" % (path, hint), EXIT_INVALID)
    return "bare"


def _row(name: Any, t: Any) -> Dict[str, Any]:
    return {"name": name, "dtype": t.dtype, "shape": list(t.shape), "offset": t._off,
            "bytes": t.nbytes, "layout": t.layout, "quant_scheme": t.quant_scheme,
            "quant_axis": t.quant_axis, "group_size": t.group_size,
            "scale_index": t.scale_index, "outer_index": t.outer_index,
            "block_size": t.block_size}


def _short(v: Any, width: int = 8) -> Any:
    """A value for printing: long arrays and lists shortened."""
    import numpy as np
    import kiln
    if isinstance(v, np.ndarray):
        items = v.ravel()[:width].tolist()
        return {"ndarray": str(v.dtype), "shape": list(v.shape),
                "first": items + (["..."] if v.size > width else [])}
    if isinstance(v, kiln.TensorDirectory):
        return {"tensors": [_row(k, t) for k, t in v.items()]}
    if isinstance(v, bytes):
        return {"bytes": len(v), "first": v[:width].hex()}
    if isinstance(v, dict):
        return {k: _short(x, width) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        out = [_short(x, width) for x in v[:width]]
        return out + (["... %d more" % (len(v) - width)] if len(v) > width else [])
    if isinstance(v, kiln.Some):
        return {"Some": _short(v.value, width)}
    return v


def _table_text(rows: List[Dict[str, Any]]) -> str:
    cols = ["name", "dtype", "shape", "offset", "bytes", "layout", "quant"]
    lines = []
    for r in rows:
        q = "-"
        if r["quant_scheme"]:
            q = "scheme %d axis %s group %d scale %s" % (r["quant_scheme"], r["quant_axis"],
                                                         r["group_size"], r["scale_index"])
            if r["outer_index"] is not None:
                q += " outer %s" % r["outer_index"]
        lines.append([str(r["name"]), str(r["dtype"]), "x".join(map(str, r["shape"])) or "()",
                      str(r["offset"]), str(r["bytes"]), r["layout"] or "-", q])
    widths = [max([len(c)] + [len(ln[i]) for ln in lines]) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    out += ["  ".join(x.ljust(w) for x, w in zip(ln, widths)) for ln in lines]
    return "\n".join(out)


def cmd_inspect(args: Any) -> int:
    import json
    import kiln
    if _records_file(args.file):
        return _inspect_records(args)
    kind = _kind(args.file)
    report: Dict[str, Any] = {"file": args.file, "size": _read(_size, args.file)}
    try:
        if args.type:
            frame = kind == "framed"
            value = kiln.load(args.file, args.type, frame=frame)
            report.update(kind="framed record" if frame else "record", type=args.type,
                          value=_short(value))
        elif kind == "directory":
            with kiln.open(args.file) as f:
                # the table only: a remote file's payloads are not fetched
                raw = f._tensors_view() if hasattr(f, "_tensors_view") else f.tensors()
                head = _head(args.file, 64)
                import struct
                count, heap, payload, dirb = struct.unpack_from("<IIQQ", head, 8)
                report.update(kind="tensor directory", header={
                    "version": head[4], "flags": head[5], "tensor_count": count,
                    "name_bytes": heap, "payload_bytes": payload, "directory_bytes": dirb},
                    tensors=[_row(k, t) for k, t in raw.items()], metadata=f.metadata)
        elif kind == "framed":
            head = _head(args.file, 16)
            report.update(kind="framed record", schema_hash="0x%016x"
                          % int.from_bytes(head[8:16], "little"),
                          note="pass --type TEXT to decode it")
        else:
            raise Fail(_NOT_KILN % args.file, EXIT_INVALID)
    except kiln.KilnError as e:
        raise Fail(_about(args.file, e), EXIT_INVALID)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.file, _oserror(e)))
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    print("%s: %s, %d bytes" % (args.file, report["kind"], report["size"]))
    if "header" in report:
        print("header: " + ", ".join("%s %s" % kv for kv in report["header"].items()))
        print(_table_text(report["tensors"]))
        if report["metadata"] is not None:
            print("metadata: " + json.dumps(report["metadata"], default=str))
    elif "value" in report:
        print(json.dumps(report["value"], indent=1, default=str))
    else:
        print("schema hash %s (%s)" % (report["schema_hash"], report["note"]))
    return 0


_NOT_KILN = ("%s is neither a tensor directory nor a framed record: pass --type TEXT "
             "to read a bare value")


def cmd_check(args: Any) -> int:
    import kiln
    if _records_file(args.file):
        return _check_records(args)
    kind = _kind(args.file)
    try:
        if args.type:
            kiln.load(args.file, args.type, frame=args.framed or kind == "framed")
            done = "the record decodes in full as %s" % args.type
        elif kind == "directory":
            with kiln.open(args.file, verify=True) as f:
                d = f.tensors()   # every payload fetched (a URL) and checked
                f.metadata        # a URL: its metadata fetched and checked too
                sums = f.checksums if hasattr(f, "checksums") else f._sums
            done = _check_words(len(d), sums is not None)
        else:
            raise Fail(_NOT_KILN % args.file, EXIT_INVALID)
    except kiln.KilnError as e:
        print(_about(args.file, "%s at byte %d: %s" % (e.code, e.offset, e.reason)))
        return EXIT_INVALID
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.file, _oserror(e)))
    print("%s: valid: %s" % (args.file, done))
    return 0


def _check_words(count: int, summed: bool) -> str:
    """What ``kiln check`` verified in a tensor file, and what it could not."""
    said = ("structure checked (header, table, names, links, alignment, zero gaps), payload "
            "rules checked (bool bytes 0 or 1, 4-bit tails)")
    if summed:
        return said + "; payload bytes match the CRC-32 recorded for each of the %d tensors" \
            % count
    return said + ("; payload bytes NOT verified: the file records no checksums (write it "
                   "with checksum=True or kiln convert --checksum)")


# --- convert -------------------------------------------------------------------

def cmd_convert(args: Any) -> int:
    import time
    import kiln
    from .convert import ConvertError, convert
    if _records_convert_wanted(args):
        return _convert_records(args)
    t = time.perf_counter()
    try:
        n = convert(args.src, args.dst, checksum=args.checksum, progress=_bar_wanted())
    except ConvertError as e:
        raise Fail(str(e), EXIT_INVALID)
    except kiln.KilnError as e:
        raise Fail(_about(args.src, e), EXIT_INVALID)
    except OSError as e:
        raise Fail("%s: %s" % (e.filename or args.src, e.strerror or e))
    print("%s -> %s: %d tensors in %.2f s" % (args.src, args.dst, n, time.perf_counter() - t))
    return 0


def _bar_wanted() -> bool:
    """A byte-counting tqdm bar on a terminal's stderr when tqdm is installed."""
    if not sys.stderr.isatty():
        return False
    import importlib.util
    return importlib.util.find_spec("tqdm") is not None


# --- record files (kiln.records) ----------------------------------------------------

# kiln.records._format.MAGIC, kept here so that `kiln inspect`/`check` of a tensor
# file does not import the record package (tests/test_records_cli.py compares them)
_RECORDS_MAGIC = b"KLNR"


def _records_file(path: str) -> bool:
    """Does ``path`` start with a record container's magic?"""
    try:
        return _head(path, 4)[:4] == _RECORDS_MAGIC
    except OSError:
        return False           # _kind reports it


def _record_type(args: Any) -> Optional[Any]:
    """The record type from --type or --schema (a JSON Schema file)."""
    import json
    import kiln
    if getattr(args, "schema", None):
        try:
            with open(args.schema, encoding="utf-8") as f:
                return kiln.schema_from_json(json.load(f))
        except OSError as e:
            raise Fail("cannot read %s: %s" % (args.schema, e.strerror or e))
        except (ValueError, kiln.KilnError) as e:
            raise Fail("%s: %s" % (args.schema, e), 1)
    return args.type or None


def _inspect_records(args: Any) -> int:
    import json
    import kiln
    from .records.tools import describe
    report: Dict[str, Any] = {"file": args.file, "size": _size(args.file)}
    try:
        report.update(describe(args.file, args.type))
        if args.type and report["type_matches"]:
            with kiln.RecordFile(args.file, args.type) as rf:
                report["first"] = [_short(v) for v in rf[:3]]
    except kiln.KilnError as e:
        raise Fail(_about(args.file, e), EXIT_INVALID)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    print("%s: record file, %d bytes, %d records, type hash %s, index at byte %d"
          % (args.file, report["size"], report["records"], report["schema_hash"],
             report["index_at"]))
    if args.type:
        print("type %s: %s" % (report["type"], "matches" if report["type_matches"]
                               else "does not match the file"))
    for v in report.get("first", []):
        print(json.dumps(v, default=str))
    return 0


def _check_records(args: Any) -> int:
    import kiln
    from .records.tools import check_all
    try:
        n = check_all(args.file, args.type)
    except kiln.KilnError as e:
        print("%s: %s at byte %d: %s" % (args.file, e.code, e.offset, e.reason))
        return 1
    print("%s: valid, %d records%s" % (args.file, n, "" if args.type else
                                         " (framing and checksums; --type also decodes)"))
    return 0


def _records_convert_wanted(args: Any) -> bool:
    exts = (os.path.splitext(args.src)[1].lower(), os.path.splitext(args.dst)[1].lower())
    return exts in ((".jsonl", ".kilnr"), (".kilnr", ".jsonl"))


def _convert_records(args: Any) -> int:
    import time
    import kiln
    from .records.tools import jsonl_to_records, records_to_jsonl
    t = _record_type(args)
    if t is None:
        raise Fail("%s -> %s needs the record type: --schema FILE or --type TEXT"
                   % (args.src, args.dst))
    start = time.perf_counter()
    go = jsonl_to_records if args.src.lower().endswith(".jsonl") else records_to_jsonl
    try:
        n = go(args.src, args.dst, t)
    except (ValueError, kiln.KilnError) as e:
        raise Fail(str(e), 1)
    except OSError as e:
        raise Fail("%s: %s" % (e.filename or args.src, e.strerror or e))
    print("%s -> %s: %d records in %.2f s" % (args.src, args.dst, n,
                                              time.perf_counter() - start))
    return 0


# --- demo ----------------------------------------------------------------------

def sample() -> Any:
    """A small model-like record: an id, a text, and tensors of several dtypes,
    including a 4-bit block-quantized weight linked to its scale tensor."""
    import numpy as np
    import kiln
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    groups = 32
    scale = (np.abs(w).reshape(64, -1, groups).max(axis=2) / 7).astype(np.float32)
    q = np.clip(np.round(w / np.repeat(scale, groups, axis=1)), -8, 7).astype(np.int8)
    tensors = [
        kiln.Tensor.from_numpy(w, name="dense.f32"),
        kiln.Tensor.from_numpy(w.astype(np.float16), name="dense.f16"),
        kiln.Tensor.from_numpy(rng.integers(-128, 127, 256).astype(np.int8), name="ids.i8"),
        kiln.Tensor(kiln.pack_nibbles(q), dtype="i4", shape=q.shape, name="dense.q4",
                    quant_scheme=1, quant_axis=1, group_size=groups, scale_index="dense.q4.scale"),
        kiln.Tensor.from_numpy(scale, name="dense.q4.scale"),
    ]
    try:
        import ml_dtypes
        tensors.insert(2, kiln.Tensor.from_numpy(w.astype(ml_dtypes.bfloat16),
                                                 name="dense.bf16"))
    except ImportError:
        tensors.insert(2, kiln.Tensor(w.astype(np.float32).view(np.uint32).__rshift__(16)
                                      .astype(np.uint16).tobytes(), dtype="bf16",
                                      shape=w.shape, name="dense.bf16"))
    return {"id": 42, "text": "a small model-like sample", "weights": tensors}


SAMPLE_TYPE = "struct{id:i64,text:str,weights:tensors,}"


def _best(fn: Any, n: int = 5) -> float:
    import time
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def cmd_demo(args: Any) -> int:
    import shutil
    import tempfile
    import kiln
    value = sample()
    if args.out:
        path = args.out
    else:   # a folder of its own, kept, so the file named below is there to look at
        path = os.path.join(tempfile.mkdtemp(prefix="kiln-demo-"), "sample.kiln")
    try:
        kiln.save(path, value, SAMPLE_TYPE)
    except (OSError, ValueError) as e:
        if not args.out:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        raise Fail("cannot write %s: %s" % (path, getattr(e, "strerror", None) or e))
    print("saved %s (%d bytes) as %s" % (path, os.path.getsize(path), SAMPLE_TYPE))
    print("(kept: open it with kiln inspect %s; delete it when done)" % path)
    back = kiln.load(path, SAMPLE_TYPE)
    d = back["weights"]
    print("opened zero-copy: id %d, text %r, %d tensors viewing the file's mapping"
          % (back["id"], back["text"], len(d)))
    print(_table_text([_row(k, t) for k, t in d.items()]))
    same = back["id"] == value["id"] and back["text"] == value["text"] and \
        all(bytes(a.data) == bytes(b.data) and a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(d.values(), value["weights"]))
    print("round trip bit for bit: %s" % ("ok" if same else "MISMATCH"))
    del d, back
    _demo_timings(value)
    return 0 if same else 1


def _demo_timings(value: Any) -> None:
    """Like with like: kiln and pickle both turn the whole record (id, text and
    every tensor) into bytes and back; safetensors holds tensors only."""
    import pickle
    import kiln
    from ._tensors.dtypes import ml_dtypes
    raw = ml_dtypes() is None   # bf16 as its bits: numpy() refuses it without ml_dtypes
    # (4-bit tensors as their packed bytes, what kiln holds: numpy() unpacks a copy)
    arrays = {t.name: t.bits() if (raw and t.dtype == "bf16") or t.dtype in ("i4", "u4", "e2m1")
              else t.numpy() for t in value["weights"]}
    record = {"id": value["id"], "text": value["text"], "weights": arrays}
    buf = kiln.encode(value, SAMPLE_TYPE, frame=True)
    blob = pickle.dumps(record, protocol=5)
    rows = [("kiln encode (record)", _best(lambda: kiln.encode(value, SAMPLE_TYPE, frame=True))),
            ("kiln decode (views)", _best(lambda: kiln.decode(buf, SAMPLE_TYPE, frame=True))),
            ("pickle dumps (record)", _best(lambda: pickle.dumps(record, protocol=5))),
            ("pickle loads (copies)", _best(lambda: pickle.loads(blob)))]
    try:
        import safetensors.numpy as stnp
        plain = {k: v for k, v in arrays.items() if v.dtype.kind in "fiub"
                 and k != "dense.bf16" and k != "dense.q4"}
        st = stnp.save(plain)
        rows += [("safetensors save (%d of %d tensors)" % (len(plain), len(arrays)),
                  _best(lambda: stnp.save(plain))),
                 ("safetensors load", _best(lambda: stnp.load(st)))]
    except ImportError:
        pass
    print("timings (best of 5, %s kernels):" % kiln.IMPLEMENTATION)
    for label, secs in rows:
        print("  %-34s %9.1f us" % (label, secs * 1e6))


# --- gen ----------------------------------------------------------------------

def cmd_gen(args: Any) -> int:
    from .schema import generate
    import kiln
    try:
        with open(args.schema, "rb") as f:
            text = f.read()
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.schema, e.strerror))
    try:
        src = generate(text, args.root)   # the text is parsed once, by the reader
    except kiln.KilnError as e:   # SchemaError included: TYPE, DEPTH or LIMIT
        raise Fail("%s: %s" % (args.schema, e), 1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(src)
    else:
        sys.stdout.write(src)
    return 0


# --- main ----------------------------------------------------------------------

class _Version(argparse.Action):
    """``kiln --version``: the version, the kernels this process imported, and whether
    the compiled tensor layer is on (kiln is imported only when asked)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        import kiln
        from kiln._tensors import BOUND   # the tensor part that serves, not the declaration
        print("kiln %s, %s kernels, compiled tensor layer %s"
              % (kiln.__version__, kiln.IMPLEMENTATION,
                 "on" if BOUND.part.__name__ == "kiln._kernels_c" else "off"))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="Kiln wire format tools",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the version and the kernels in use, then exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("demo", help="save, open and check a sample model; timings")
    c.add_argument("--out", help="where to save the sample (default: sample.kiln in a new "
                   "temporary folder, kept and printed)")
    c.set_defaults(fn=cmd_demo)
    c = sub.add_parser("inspect", help="what a file is: header, tensor table, metadata")
    c.add_argument("file")
    c.add_argument("--type", help="decode as this type (a record)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(fn=cmd_inspect)
    c = sub.add_parser("check", help="exit 0 when the file is valid")
    c.add_argument("file")
    c.add_argument("--type", help="check as a record of this type")
    c.add_argument("--framed", action="store_true", help="the record has a 16-byte frame")
    c.set_defaults(fn=cmd_check)
    c = sub.add_parser("convert", help="convert between .kiln, .safetensors, .gguf and .npz")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--schema", help="JSON Schema of the records (.jsonl <-> .kilnr)")
    c.add_argument("--type", help="type text of the records (.jsonl <-> .kilnr)")
    c.add_argument("--checksum", action="store_true",
                   help="record a CRC-32 of every tensor in a .kiln destination")
    c.set_defaults(fn=cmd_convert)
    c = sub.add_parser("cases", help="run the golden cases against the active implementation")
    c.add_argument("file", nargs="?", help="case file (default: the cases shipped with kiln)")
    c.add_argument("-v", "--verbose", action="store_true")
    c.set_defaults(fn=cmd_cases)
    c = sub.add_parser("gen", help="a module of dataclasses from a JSON Schema")
    c.add_argument("schema")
    c.add_argument("-o", "--output", help="module path (default: stdout)")
    c.add_argument("--root", help="the root class's name (default: the title, or Root)")
    c.set_defaults(fn=cmd_gen)
    c = sub.add_parser("hash", help="print the canonical text and schema hash of a type")
    c.add_argument("type_text")
    c.set_defaults(fn=cmd_hash)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
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
