"""The record container's commands: ``kiln inspect``, ``kiln check`` and
``kiln convert`` (``.jsonl`` <-> ``.kilnr``) of record files (``kiln.records``)."""

import os
from typing import Any, Dict, Optional

from .common import EXIT_INVALID, Fail, about, short, size


def _record_type(args: Any) -> Optional[Any]:
    """The record type from --type or --schema (a JSON Schema file)."""
    import json
    import kiln
    if getattr(args, "schema", None):
        try:
            with open(args.schema, encoding="utf-8") as f:
                # JSON's own values: arrays as lists (a uint8 array is no base64 text)
                return kiln.schema_from_json(json.load(f), arrays="list")
        except OSError as e:
            raise Fail("cannot read %s: %s" % (args.schema, e.strerror or e))
        except (ValueError, kiln.KilnError) as e:
            raise Fail("%s: %s" % (args.schema, e), 1)
    return args.type or None


def inspect_records(args: Any) -> int:
    import json
    import kiln
    from ..records.tools import describe
    report: Dict[str, Any] = {"file": args.file, "size": size(args.file)}
    try:
        report.update(describe(args.file, args.type))
        if args.type and report["type_matches"]:
            with kiln.RecordFile(args.file, args.type) as rf:
                report["first"] = [short(v) for v in rf[:3]]
    except kiln.KilnError as e:
        raise Fail(about(args.file, e), EXIT_INVALID)
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


def check_records(args: Any) -> int:
    import kiln
    from ..records.tools import check_all
    try:
        n = check_all(args.file, args.type)
    except kiln.KilnError as e:
        print("%s: %s at byte %d: %s" % (args.file, e.code, e.offset, e.reason))
        return 1
    print("%s: valid, %d records%s" % (args.file, n, "" if args.type else
                                         " (framing and checksums; --type also decodes)"))
    return 0


def convert_wanted(args: Any) -> bool:
    exts = (os.path.splitext(args.src)[1].lower(), os.path.splitext(args.dst)[1].lower())
    return exts in ((".jsonl", ".kilnr"), (".kilnr", ".jsonl"))


def convert_records(args: Any) -> int:
    import time
    import kiln
    from ..records.tools import jsonl_to_records, records_to_jsonl
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
