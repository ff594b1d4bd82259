"""Command line: ``kiln cases [FILE]`` and ``kiln hash TYPE_TEXT``."""

import argparse
import json
import os
import sys


def _default_cases():
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "spec", "kiln-v2-cases.json"),
                 os.path.join(os.getcwd(), "spec", "kiln-v2-cases.json")):
        if os.path.exists(cand):
            return os.path.normpath(cand)
    return None


def run_case(case, kiln):
    """Decode one golden case; return (ok, actual outcome string)."""
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


def cmd_cases(args):
    import kiln
    path = args.file or _default_cases()
    if path is None:
        print("kiln cases: no case file given and spec/kiln-v2-cases.json not found",
              file=sys.stderr)
        return 2
    with open(path) as f:
        doc = json.load(f)
    cases = doc["cases"]
    failed = 0
    for case in cases:
        ok, actual, detail = run_case(case, kiln)
        if not ok:
            failed += 1
            exp = "accept" if case["result"] == "accept" else "reject %s" % case["error"]
            print("FAIL %s: expected %s, got %s %s" % (case["name"], exp, actual, detail))
    print("implementation: %s" % kiln.IMPLEMENTATION)
    print("cases: %s" % path)
    print("%d passed, %d failed" % (len(cases) - failed, failed))
    return 1 if failed else 0


def cmd_hash(args):
    import kiln
    try:
        t = kiln.parse_type(args.type_text)
    except kiln.KilnError as e:
        print("kiln hash: %s" % e, file=sys.stderr)
        return 2
    print(t.text)
    print("0x%016x" % t.schema_hash)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="kiln", description="Kiln wire format tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cases", help="run the golden cases against the active implementation")
    c.add_argument("file", nargs="?", help="case file (default: spec/kiln-v2-cases.json)")
    c.set_defaults(fn=cmd_cases)
    h = sub.add_parser("hash", help="print the canonical text and schema hash of a type")
    h.add_argument("type_text")
    h.set_defaults(fn=cmd_hash)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
