"""``kiln cases`` (the golden cases against the kernels in use), ``kiln hash``
(canonical type text and schema hash) and ``kiln gen`` (dataclasses from a
JSON Schema)."""

import sys
from typing import Any, Dict

from .common import EXIT_INVALID, Fail


def _cases_path() -> str:
    from ..data import cases_path   # the wheel's copy, or spec/ in a checkout
    return cases_path()


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
    from .._access import open_regular_file
    path = args.file or _cases_path()
    try:
        with open_regular_file(path, text=True) as f:
            cases = json.load(f)["cases"]
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, e.strerror or e))
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
def cmd_gen(args: Any) -> int:
    from ..schema import generate
    from .._access import open_regular_file
    import kiln
    try:
        with open_regular_file(args.schema) as f:
            text = f.read()
    except OSError as e:
        raise Fail("cannot read %s: %s" % (args.schema, e.strerror or e))
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
