"""The ``kiln`` command (also ``python -m kiln``).

Exit codes: 0 success; 1 a check failed (an invalid file, a failing case);
2 a usage error or a file that cannot be read or converted.  Errors are one
line on stderr, never a traceback.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

EPILOG = """examples:
  kiln demo                              save, open and check a sample model
  kiln inspect model.kiln                the tensor table and the metadata
  kiln inspect rec.kiln --type 'struct{id:i64,batch:tensors}'
  kiln check model.kiln                  exit 0 when valid, else code, offset, reason
  kiln convert model.safetensors model.kiln     also .gguf and .npz in, .safetensors
  kiln convert model.kiln model.npz              and .npz out
  kiln cases                             the golden cases that ship with kiln
  kiln gen schema.json -o records.py     dataclasses from a JSON Schema
  kiln hash 'struct{id:i64,name:str}'    canonical text and schema hash

exit codes: 0 ok, 1 invalid input or a failed case, 2 usage or I/O error"""


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
    import kiln
    path = args.file or _cases_path()
    try:
        with open(path) as f:
            cases = json.load(f)["cases"]
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, e.strerror))
    except (ValueError, KeyError, TypeError):
        raise Fail("%s is not a Kiln case file (JSON with a \"cases\" list)" % path)
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

def _head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of a regular file or a URL (one range request):
    a FIFO, a socket or a device is refused without waiting on it."""
    from .remote import head, is_url
    if is_url(path):
        return head(path, n)[1]
    from ._local import read_head
    return read_head(path, n)


def _size(path: str) -> int:
    from .remote import head, is_url
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
    except ImportError as e:
        raise Fail("cannot read %s: %s" % (path, e), 2)
    if magic == b"KLNT":
        return "directory"
    if magic == b"KLN0":
        return "framed"
    if not magic:
        raise Fail("%s is empty" % path, 1)
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
    import kiln
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
            raise Fail("%s is neither a tensor directory nor a framed record: pass --type "
                       "TEXT to read a bare value" % args.file, 1)
    except kiln.KilnError as e:
        raise Fail("%s: %s" % (args.file, e), 1)
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


def cmd_check(args: Any) -> int:
    import kiln
    kind = _kind(args.file)
    try:
        if args.type:
            kiln.load(args.file, args.type, frame=args.framed or kind == "framed")
        elif kind == "directory":
            if _is_url(args.file):
                with kiln.open(args.file) as f:
                    f.tensors()   # every payload fetched and checked, then the metadata
                    f.metadata
            else:
                kiln.load_tensors(args.file)   # every check up front, metadata included
        else:
            raise Fail("%s: pass --type TEXT to check a record" % args.file)
    except kiln.KilnError as e:
        print("%s: %s at byte %d: %s" % (args.file, e.code, e.offset, e.reason))
        return 1
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.file, _oserror(e)))
    print("%s: valid" % args.file)
    return 0


# --- convert -------------------------------------------------------------------

def cmd_convert(args: Any) -> int:
    import kiln
    from .convert import ConvertError, convert
    t = time.perf_counter()
    try:
        n = convert(args.src, args.dst)
    except (ConvertError, kiln.KilnError) as e:
        raise Fail(str(e), 1)
    except OSError as e:
        raise Fail("%s: %s" % (e.filename or args.src, e.strerror or e))
    print("%s -> %s: %d tensors in %.2f s" % (args.src, args.dst, n, time.perf_counter() - t))
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
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def cmd_demo(args: Any) -> int:
    import pickle
    import kiln
    value = sample()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "sample.kiln")
        kiln.save(path, value, SAMPLE_TYPE)
        print("saved %s (%d bytes) as %s" % (os.path.basename(path), os.path.getsize(path),
                                              SAMPLE_TYPE))
        back = kiln.load(path, SAMPLE_TYPE)
        d = back["weights"]
        print("opened zero-copy: id %d, text %r, %d tensors viewing the file's mapping"
              % (back["id"], back["text"], len(d)))
        print(_table_text([_row(k, t) for k, t in d.items()]))
        same = back["id"] == value["id"] and back["text"] == value["text"] and \
            all(bytes(a.data) == bytes(b.data) and a.shape == b.shape and a.dtype == b.dtype
                for a, b in zip(d.values(), value["weights"]))
        print("round trip bit for bit: %s" % ("ok" if same else "MISMATCH"))
        arrays = {t.name: t.numpy() for t in value["weights"]}
        buf = kiln.encode(value, SAMPLE_TYPE, frame=True)
        blob = pickle.dumps({"id": 42, "text": value["text"], "weights": arrays}, protocol=5)
        rows = [("kiln encode", _best(lambda: kiln.encode(value, SAMPLE_TYPE, frame=True))),
                ("kiln decode (views)", _best(lambda: kiln.decode(buf, SAMPLE_TYPE, frame=True))),
                ("pickle dumps", _best(lambda: pickle.dumps(arrays, protocol=5))),
                ("pickle loads", _best(lambda: pickle.loads(blob)))]
        try:
            import safetensors.numpy as stnp
            st = stnp.save({k: v for k, v in arrays.items() if v.dtype.kind in "fiub"
                            and "bfloat" not in str(v.dtype)})
            rows += [("safetensors save", _best(lambda: stnp.save(
                {k: v for k, v in arrays.items() if v.dtype.kind in "fiub"
                 and "bfloat" not in str(v.dtype)}))),
                ("safetensors load", _best(lambda: stnp.load(st)))]
        except ImportError:
            pass
        print("timings (best of 5, %s kernels):" % kiln.IMPLEMENTATION)
        for label, secs in rows:
            print("  %-22s %9.1f us" % (label, secs * 1e6))
        del d, back
    return 0 if same else 1


# --- gen ----------------------------------------------------------------------

def cmd_gen(args: Any) -> int:
    from .schema import SchemaError, generate
    import kiln
    try:
        with open(args.schema) as f:
            doc = json.load(f)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.schema, e.strerror))
    except ValueError as e:
        raise Fail("%s is not JSON: %s" % (args.schema, e))
    try:
        src = generate(doc, args.root)
    except (SchemaError, kiln.KilnError) as e:
        raise Fail("%s: %s" % (args.schema, e), 1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(src)
    else:
        sys.stdout.write(src)
    return 0


# --- main ----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="Kiln wire format tools",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("demo", help="save, open and check a sample model; timings")
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
        return int(args.fn(args))
    except Fail as e:
        print("kiln %s: %s" % (args.cmd, e), file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
