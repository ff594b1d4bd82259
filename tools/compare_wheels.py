"""Compare two wheels file for file: the same names, the same bytes.

    python tools/compare_wheels.py A.whl B.whl

Used by tools/check-dist.sh to show that the wheel built from the sdist is the
wheel built from the checkout.  Zip timestamps are not compared (they are the
build's, not the files').  A compiled module is compared as its loadable
contents: its debug sections and build-id note name the directory the build
ran in, so they are removed (objcopy) from both copies before the bytes are
compared; every other byte, code and data, must match.  The RECORD files are
compared with those modules' hash lines left out (they hash the raw files).
Exits 1 and names each difference.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

MODULE_SUFFIXES = (".so", ".pyd", ".dylib")


def _loadable(data):
    """The bytes of a compiled module less its debug sections and build id."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        return data
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        with open(src, "wb") as f:
            f.write(data)
        subprocess.run([objcopy, "--strip-debug", "--remove-section=.note.gnu.build-id",
                        src, dst], check=True)
        with open(dst, "rb") as f:
            return f.read()


def _record_lines(data, skip):
    return sorted(line for line in data.decode().splitlines()
                  if line and line.split(",", 1)[0] not in skip)


def differences(a, b):
    problems = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        na = {n for n in za.namelist() if not n.endswith("/")}
        nb = {n for n in zb.namelist() if not n.endswith("/")}
        for n in sorted(na - nb):
            problems.append("only in %s: %s" % (os.path.basename(a), n))
        for n in sorted(nb - na):
            problems.append("only in %s: %s" % (os.path.basename(b), n))
        modules = {n for n in na & nb if n.endswith(MODULE_SUFFIXES)}
        for n in sorted(na & nb):
            da, db = za.read(n), zb.read(n)
            if n.endswith(".dist-info/RECORD"):
                same = _record_lines(da, modules) == _record_lines(db, modules)
            elif n in modules and da != db:
                same = _loadable(da) == _loadable(db)
            else:
                same = da == db
            if not same:
                problems.append("differs: %s" % n)
    return problems


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    problems = differences(*argv)
    for p in problems:
        print("  " + p)
    with zipfile.ZipFile(argv[0]) as z:
        count = sum(1 for n in z.namelist() if not n.endswith("/"))
    print("compare_wheels: %d files, %s" % (count, "identical" if not problems else
                                              "%d differences" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
