"""``kiln inspect``, ``kiln check`` and ``kiln convert`` of tensor files and
framed records (a record container is handed to ``kiln._cli.records``)."""

import sys
from typing import Any, Dict

from .. import _wire as W
from .common import (EXIT_INVALID, EXIT_USAGE, NOT_KILN, Fail, dumps, head, kind, located,
                     oserror, read, records_file, row, short, size, table_text)


def cmd_inspect(args: Any) -> int:
    import kiln
    if records_file(args.file):
        from .records import inspect_records
        return inspect_records(args)
    if not args.type and _sharded(args.file):
        return _inspect_set(args)
    what = kind(args.file)
    report: Dict[str, Any] = {"file": args.file, "size": read(size, args.file)}
    try:
        if args.type:
            frame = what == "framed"
            value = kiln.load(args.file, args.type, frame=frame)
            report.update(kind="framed record" if frame else "record", type=args.type,
                          value=short(value, at=_value_at(args.file) if frame else 0))
        elif what == "directory":
            from .._access import table
            with kiln.open(args.file) as f:
                raw = table(f)   # the table only: a remote file's payloads are not fetched
                _, version, flags, _, count, heap, payload, dirb, _ = W.HEADER.unpack_from(
                    head(args.file, W.HEADER_SIZE))   # (the open checked it is all there)
                report.update(kind="tensor directory", header={
                    "version": version, "flags": flags, "tensor_count": count,
                    "name_bytes": heap, "payload_bytes": payload, "directory_bytes": dirb},
                    tensors=[row(k, t) for k, t in raw.items()], metadata=f.metadata)
        elif what == "framed" and _saved(args.file)[1] is not None:   # it stores its type
            at, text = _saved(args.file)
            value = kiln.load(args.file)
            report.update(kind="framed record", type=text, stored_type=True,
                          value=short(value, at=at))
        elif what == "framed":
            at = _value_at(args.file)   # after kiln.save's pad head, when there is one
            fhead = head(args.file, at + W.FRAME_SIZE)[at:]   # (a short file: what it has)
            _frame_read(fhead, at)   # a hash only where the file holds a whole frame head
            report.update(kind="framed record", schema_hash="0x%016x"
                          % int.from_bytes(fhead[W.FRAME_HASH:W.FRAME_SIZE], "little"),
                          note="pass --type TEXT to decode it")
            if at:
                report.update(value_offset=at)
        else:
            raise Fail(NOT_KILN % args.file, EXIT_INVALID)
    except kiln.KilnError as e:
        raise Fail(located(args.file, e), EXIT_INVALID)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.file, oserror(e)))
    if args.json:
        print(dumps(report, indent=1))
        return 0
    print("%s: %s, %d bytes" % (args.file, report["kind"], report["size"]))
    if "header" in report:
        print("header: " + ", ".join("%s %s" % kv for kv in report["header"].items()))
        print(table_text(report["tensors"]))
        if report["metadata"] is not None:
            print("metadata: " + dumps(report["metadata"]))
    elif "value" in report:
        if report.get("stored_type"):
            print("stored type %s" % report["type"])
        print(dumps(report["value"], indent=1))
    else:
        print("schema hash %s (%s)" % (report["schema_hash"], report["note"]))
        if "value_offset" in report:
            print("the framed value starts at byte %d, after a pad head that aligns its "
                  "tensors" % report["value_offset"])
    return 0


def _frame_read(frame: bytes, at: int) -> None:
    """KilnError unless ``frame`` (the file's bytes from ``at``) starts with a
    whole frame's magic and fields (as ``kiln check --type`` says it: EOF or
    FRAME at ``at``): inspect prints no field the file does not hold."""
    if len(frame) >= 4 and frame[:4] != W.FRAME_MAGIC:
        import kiln
        raise kiln.KilnError("FRAME", at, "frame magic is %r, not %r"
                             % (bytes(frame[:4]), W.FRAME_MAGIC))
    if len(frame) < W.FRAME_SIZE:
        import kiln
        raise kiln.KilnError("EOF", at, "a frame needs %d bytes, the file has %d from here"
                             % (W.FRAME_SIZE, len(frame)))


def _saved(path: str) -> Any:
    """(where a framed file's value starts, the type text it stores or None):
    after kiln.save's head, type text and pad (checked: KilnError), else 0."""
    from .._access import saved_head, saved_head_size
    return saved_head(head(path, saved_head_size(head(path, W.TYPED_SIZE))))


def _value_at(path: str) -> int:
    return _saved(path)[0]


def _inspect_set(args: Any) -> int:
    """``kiln inspect`` of a sharded set: the index, then each shard's header and
    table (no payload read, nor fetched from a URL), one table across the set."""
    import os
    import kiln
    from .._access import table
    where = args.file   # the file a fault is in: the index, then each shard
    try:
        with kiln.open(args.file) as f:
            shards, rows = [], []
            for s in f.shards:
                where = f.shard_path(s)
                sf = f.shard(s)   # opened and checked against the index
                raw = table(sf)
                n = getattr(sf, "size", None)   # a URL's, from its first answer
                shards.append({"file": s, "tensors": len(raw),
                               "size": os.path.getsize(sf.path) if n is None else n})
                rows.extend(dict(row(k, t), shard=s) for k, t in raw.items())
            where = args.file
            order = {n: i for i, n in enumerate(f.keys())}
            rows.sort(key=lambda r: order[r["name"]])   # the index's order
            report = {"file": args.file, "kind": "sharded set", "index": f.path,
                      "total_size": f.total_size, "shards": shards, "tensors": rows,
                      "metadata": f.metadata}
    except kiln.KilnError as e:
        raise Fail(located(where, e), EXIT_INVALID)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (getattr(e, "filename", None) or where, oserror(e)))
    except ValueError as e:   # a folder holding several indexes
        raise Fail(str(e), EXIT_USAGE)
    if args.json:
        print(dumps(report, indent=1))
        return 0
    print("%s: sharded set, %d tensors in %d shards, %d payload bytes (index %s, "
          "total_size %s)" % (args.file, len(rows), len(shards),
                              sum(r["bytes"] for r in rows), report["index"],
                              report["total_size"]))
    for s in shards:
        print("  %s: %d tensor%s, %d bytes" % (s["file"], s["tensors"],
                                               "" if s["tensors"] == 1 else "s", s["size"]))
    print(table_text(rows, shard=True))
    if report["metadata"] is not None:
        print("metadata: " + dumps(report["metadata"]))
    return 0


def cmd_check(args: Any) -> int:
    import kiln
    if records_file(args.file):
        from .records import check_records
        return check_records(args)
    if not args.type and _sharded(args.file):
        return _check_set(args.file)
    what = kind(args.file)
    try:
        if args.type:
            kiln.load(args.file, args.type, frame=args.framed or what == "framed")
            done = "the record decodes in full as %s" % args.type
        elif what == "directory":
            with kiln.open(args.file, verify=True) as f:
                d = f.tensors()   # every payload fetched (a URL) and checked
                f.metadata        # a URL: its metadata fetched and checked too
                sums = f.checksums
            done = _check_words(len(d), sums is not None)
        elif what == "framed" and _saved(args.file)[1] is not None:   # it stores its type
            text = _saved(args.file)[1]
            kiln.load(args.file)
            done = "the record decodes in full as %s (the type the file stores)" % text
        elif what == "framed":   # its frame names a type by hash only: the value needs the type
            raise Fail("%s is a framed record (kiln inspect shows its schema hash): kiln check "
                       "needs its type to check the value: pass --type TEXT" % args.file,
                       EXIT_USAGE)
        else:
            raise Fail(NOT_KILN % args.file, EXIT_INVALID)
    except kiln.KilnError as e:
        print(located(args.file, e))
        return EXIT_INVALID
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.file, oserror(e)))
    print("%s: valid: %s" % (args.file, done))
    return 0


def _sharded(path: str) -> bool:
    import os
    return path.endswith(".index.json") or ("://" not in path and os.path.isdir(path))


def _check_set(path: str) -> int:
    """``kiln check`` of a sharded set: the index, then every shard in full."""
    import kiln
    try:
        with kiln.open(path) as f:
            f.tensors()   # every shard opened, checked against the index, its payloads checked
            summed = all(f.shard(s).checksums is not None for s in f.shards)
            count, shards = len(f), len(f.shards)
    except kiln.KilnError as e:
        print(located(path, e))
        return EXIT_INVALID
    except OSError as e:
        raise Fail("cannot read %s: %s" % (getattr(e, "filename", None) or path, oserror(e)))
    except ValueError as e:   # a folder holding several indexes
        raise Fail(str(e), EXIT_USAGE)
    print("%s: valid: a set of %d shards, the index's names matched; %s"
          % (path, shards, _check_words(count, summed)))
    return 0


def _check_words(count: int, summed: bool) -> str:
    """What ``kiln check`` verified in a tensor file, and what it could not."""
    said = ("structure checked (header, table, names, links, alignment, zero gaps), payload "
            "rules checked (bool bytes 0 or 1, 4-bit tails)")
    if summed:
        return said + "; payload bytes match the CRC-32 recorded for %s" % (
            "the tensor" if count == 1 else "each of the %d tensors" % count)
    return said + ("; payload bytes NOT verified: the file records no checksums (write it "
                   "with checksum=True or kiln convert --checksum)")


# --- convert -------------------------------------------------------------------

def cmd_convert(args: Any) -> int:
    import time
    import kiln
    from ..convert import ConvertError, UnsupportedConversion, convert
    from .records import convert_records, convert_wanted
    if convert_wanted(args):
        return convert_records(args)
    t = time.perf_counter()
    try:
        n = convert(args.src, args.dst, checksum=args.checksum, progress=_bar_wanted())
    except UnsupportedConversion as e:   # what was asked, not what a file holds
        raise Fail(str(e), EXIT_USAGE)
    except ConvertError as e:
        raise Fail(str(e), EXIT_INVALID)
    except kiln.EncodeError as e:   # what the destination's writer refused: its path
        raise Fail(located(args.dst, e), EXIT_INVALID)   # (e.path is a place in a value)
    except kiln.KilnError as e:
        raise Fail(located(getattr(e, "path", None) or args.src, e), EXIT_INVALID)
    except OSError as e:
        raise Fail("%s: %s" % (e.filename or args.src, e.strerror or e))
    print("%s -> %s: %d tensor%s in %.2f s" % (args.src, args.dst, n, "" if n == 1 else "s",
                                              time.perf_counter() - t))
    return 0


def _bar_wanted() -> bool:
    """A byte-counting tqdm bar on a terminal's stderr when tqdm is installed."""
    if not sys.stderr.isatty():
        return False
    import importlib.util
    return importlib.util.find_spec("tqdm") is not None
