"""The record container's commands: ``kiln inspect``, ``kiln check`` and
``kiln convert`` (``.jsonl`` <-> ``.kilnr``) of record files (``kiln.records``)."""

import os
from typing import Any, Dict, Optional

from .common import EXIT_INVALID, EXIT_USAGE, Fail, located, short, size, what


def _record_type(args: Any) -> Optional[Any]:
    """The record type from --type or --schema (a JSON Schema file)."""
    import json
    import kiln
    from .._access import open_regular_file
    if getattr(args, "schema", None):
        try:
            with open_regular_file(args.schema, text=True) as f:
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
    recover = bool(getattr(args, "recover", False))
    try:
        report.update(describe(args.file, args.type, recover))
        # the first records, decoded with the type given or the one the file stores
        if (args.type and report["type_matches"]) or (not args.type and
                                                      report["stored_type"]):
            with kiln.RecordFile(args.file, args.type or None, recover=recover) as rf:
                report["first"] = [short(v) for v in rf[:3]]
    except kiln.KilnError as e:
        raise Fail(located(args.file, e), EXIT_INVALID)
    # a type that is not the file's is a failed inspection, not a report
    code = EXIT_INVALID if args.type and not report["type_matches"] else 0
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return code
    torn = report.get("torn")
    n = report["records"]
    print("%s: record file, %d bytes, %d record%s, type hash %s, %s"
          % (args.file, report["size"], n, "" if n == 1 else "s", report["schema_hash"],
             "index at byte %d" % report["index_at"] if torn is None else
             "torn: complete records up to byte %d, then %s" % (torn["complete_until"],
                                                                 torn["why"])))
    if report["stored_type"]:
        print("stored type %s" % report["stored_type"])
    if args.type:
        print("type %s: %s" % (report["type"], "matches" if report["type_matches"]
                               else "does not match the file"))
    for v in report.get("first", []):
        print(json.dumps(v, default=str))
    return code


def check_records(args: Any) -> int:
    import kiln
    from ..records.tools import check_all
    try:
        n, torn = check_all(args.file, args.type, bool(getattr(args, "recover", False)))
    except kiln.KilnError as e:
        print(located(args.file, e))
        return 1
    if torn is not None:   # --recover: the complete records check, the file is still torn
        print("%s: torn: %d complete record%s valid, up to byte %d; then %s at byte %d: %s"
              % (args.file, n, "" if n == 1 else "s", torn.offset, torn.error.code,
                 torn.error.offset, what(args.file, torn.error)))
        return 1
    decoded = args.type or _stores_type(args.file)
    print("%s: valid, %d record%s%s" % (args.file, n, "" if n == 1 else "s",
                                        "" if decoded else
                                        " (framing and checksums; --type also decodes)"))
    return 0


def _stores_type(path: str) -> bool:
    from ..records.tools import RawRecords
    with RawRecords(path, True) as rf:
        return rf.type_text is not None


def convert_wanted(args: Any) -> bool:
    exts = (os.path.splitext(args.src)[1].lower(), os.path.splitext(args.dst)[1].lower())
    return exts in ((".jsonl", ".kilnr"), (".kilnr", ".jsonl"))


def convert_records(args: Any) -> int:
    import time
    import kiln
    from ..records.tools import JsonLinesError, jsonl_to_records, records_to_jsonl
    t = _record_type(args)
    to_records = args.src.lower().endswith(".jsonl")
    if t is None and to_records:
        raise Fail("%s -> %s needs the record type: --schema FILE or --type TEXT"
                   % (args.src, args.dst))
    if isinstance(t, str):
        try:
            t = kiln.parse_type(t)
        except kiln.KilnError as e:   # the command's argument, not the file, is wrong
            raise Fail("--type %r: %s" % (t, e.reason), EXIT_USAGE)
    start = time.perf_counter()
    rounding = bool(getattr(args, "round_floats", False))
    try:
        if to_records:
            n = jsonl_to_records(args.src, args.dst, t, round_floats=rounding)
        else:
            n = records_to_jsonl(args.src, args.dst, t)
    except TypeError as e:      # a record file that stores no type text, and none given
        raise Fail("%s; --schema FILE or --type TEXT gives it" % e)
    except kiln.KilnError as e:
        if isinstance(e, JsonLinesError):   # a line: the file, the line and the field
            raise Fail(str(e).replace("pass round_floats=True", "pass --round-floats"), 1)
        raise Fail(located(args.src, e), 1)   # the record file's fault, where it is
    except ValueError as e:   # a JSON Lines line: the file, the line and the field
        # (the library's option is this command's flag)
        raise Fail(str(e).replace("pass round_floats=True", "pass --round-floats"), 1)
    except OSError as e:
        raise Fail("%s: %s" % (e.filename or args.src, e.strerror or e))
    print("%s -> %s: %d record%s in %.2f s" % (args.src, args.dst, n, "" if n == 1 else "s",
                                               time.perf_counter() - start))
    return 0
