#!/usr/bin/env python3
"""Break kiln on purpose, one fault at a time, and require the tests to fail.

    tools/mutation-check.py [--list] [--only NAME ...] [--no-compiled]
                            [--no-baseline] [--keep]

Each fault is a small source patch (one exact text replaced by another).  For
each, the tracked files of this checkout (plus the built kiln/_kernels_c*.so)
are copied once to a temporary directory, and for each fault that copy is
copied again and the patch applied there, the compiled
module is rebuilt there when the patch is in src/ (about a minute each), and
the fault's test files run with ``--c-extensions -x -q``.  The checkout itself
is never changed.  First the unpatched copy runs every selected test file once
(the baseline), so that a failure is the fault's, not the tree's.

Prints a table: fault, tests run, caught yes/no, the first failing test.  Exit status: 0 when every
fault made its tests fail; 1 when any fault survived (or the baseline
failed); 2 when a patch no longer applies (the source moved: update FAULTS).
Run it from the dev venv (numpy, Cython, pytest, hypothesis, dask ...):

    python tools/mutation-check.py                 # all faults (the baseline is most of it)
    python tools/mutation-check.py --no-compiled   # the Python faults only
    python tools/mutation-check.py --no-baseline   # trust that the tree passes its tests
    python tools/mutation-check.py --only py-widen-ints c-np-setup-false
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

Fault = namedtuple("Fault", "name path old new tests what")

VALUES = ["tests/test_golden.py", "tests/test_properties.py", "tests/test_differential.py"]
PATHS = ["tests/test_paths.py", "tests/test_tensor_arrays.py", "tests/test_compat.py"]

FAULTS = [
    Fault("py-widen-ints", "kiln/_kernels_py/decode.py",
          '    nat = le.newbyteorder("=")\n    w = le.itemsize',
          '    nat = np.dtype("=i8") if le.kind == "i" and le.itemsize < 8 else '
          'le.newbyteorder("=")\n    w = le.itemsize',
          VALUES, "the pure decoder returns int64 arrays for list<i8/i16/i32>"),
    Fault("py-dir-offset-off-by-one", "kiln/_kernels_py/directory.py",
          'raise err("TYPE", d + W.D_SHAPE + 8 * k,',
          'raise err("TYPE", d + W.D_SHAPE + 8 * k + 1,',
          ["tests/test_golden.py", "tests/test_hostile.py"],
          "a shape slot past the rank is reported one byte late"),
    Fault("py-utf8-dropped", "kiln/_kernels_py/decode.py",
          'self.errors = "surrogateescape" if trusted else "strict"',
          'self.errors = "surrogateescape"',
          VALUES, "the pure decoder never checks the UTF-8 of str values and dict keys"),
    Fault("py-bool-payload-dropped", "kiln/_kernels_py/directory.py",
          "            bad = raw > 1\n", "            bad = raw > 255\n",
          ["tests/test_golden.py", "tests/test_hostile.py"],
          "bool tensor bytes above 1 are accepted"),
    Fault("py-frame-hash-ignored", "kiln/_kernels_py/reader.py",
          "    if h != expected_hash:", "    if False:",
          ["tests/test_golden.py", "tests/test_differential.py"],
          "a frame's schema hash is not compared"),
    Fault("py-limit-off-by-one", "kiln/_kernels_py/reader.py",
          "    if c > cap:", "    if c > cap + 1:",
          ["tests/test_golden.py", "tests/test_amplification.py"],
          "a count one above max_count is allowed"),
    Fault("py-scale-count-skipped", "kiln/_kernels_py/directory.py",
          "        if st.counts[scale] != groups:", "        if False:",
          ["tests/test_golden.py", "tests/test_hostile.py"],
          "a scale tensor of the wrong element count is accepted"),
    Fault("py-dict-order-unchecked", "kiln/_kernels_py/decode.py",
          "            if prev is not None and raw <= prev:",
          "            if prev is not None and raw < prev:",
          VALUES, "a repeated dict key is accepted (the last value wins)"),
    Fault("py-zero-budget-per-list", "kiln/_kernels_py/decode.py",
          "            budget.left = left - c\n", "",
          ["tests/test_golden.py", "tests/test_amplification.py"],
          "each list of zero-size elements gets a whole budget (9 GB from 36 bytes)"),
    Fault("py-compiled-tensor-layer-off", "kiln/_tensors/bind.py",
          "    part = kernels\n", "    from .. import _kernels_py as part\n",
          PATHS, "the compiled tensor part is never bound (Tensor.numpy/values/to_dict)"),
    Fault("py-impl-binds-nothing", "tests/conftest.py",
          "    _tensors.bind(kernels)   #", "    #",
          PATHS, "the impl fixture leaves the tensor objects on the process default"),
    Fault("py-purepython-ignored", "kiln/_compat.py",
          'NO_EXTENSIONS = os.environ.get("KILN_PUREPYTHON", "") not in ("", "0") or \\',
          'NO_EXTENSIONS = False and os.environ.get("KILN_PUREPYTHON", "") or \\',
          ["tests/test_compat.py", "tests/test_cli.py"],
          "KILN_PUREPYTHON=1 still imports the compiled kernels"),
    Fault("dask-serializer-unregistered", "kiln/dask.py",
          "@dask_serialize.register(Tensor)\n", "",
          ["tests/test_dask.py"],
          "Tensor has no dask serializer (distributed falls back to pickle)"),
    Fault("py-record-crc-unchecked", "kiln/_kernels_py/records.py",
          "                    (verify and crc(mv[at:e]) != unpack_crc(mv, e)[0])):",
          "                    False):",
          ["tests/test_records.py", "tests/test_records_kernel.py"],
          "the pure record loop never compares a record body's CRC-32"),
    Fault("c-record-crc-unchecked", "src/kernels/records.pxi",
          "    if verify and kiln_crc32(0, q, body) != kiln_ld_u32(q + body):",
          "    if False:",
          ["tests/test_records.py", "tests/test_records_kernel.py"],
          "the compiled record loop never compares a record body's CRC-32"),
    Fault("c-np-setup-false", "src/kernels/numpy.pxi",
          "    _np_fast = True\n    return True", "    _np_fast = False\n    return False",
          PATHS, "numpy's C-API table refused: every compiled numpy fast path off"),
    Fault("c-directory-setup-false", "src/kernels/tensors.pxi",
          "    _D_ok = True\n    return True", "    _D_ok = False\n    return False",
          PATHS, "the compiled view directories are off (decode calls HOOKS.build)"),
    Fault("c-tensor-setup-false", "src/kernels/tensors.pxi",
          "    _T_ok = True\n    return True", "    _T_ok = False\n    return False",
          PATHS, "the compiled tensor part declines kiln.Tensor"),
    Fault("c-slot-renamed", "src/kernels/wire.pxi",
          "'_off', '_own')", "'_off', '_held')",
          PATHS + ["tests/test_house.py"],
          "the compiled tensor part looks for a slot the class does not have"),
    Fault("c-entry-point-renamed", "src/kernels/tensors.pxi",
          "def check_links(head):", "def check_links_(head):",
          PATHS + ["tests/test_house.py"],
          "the compiled kernel's check_links is gone (renamed)"),
    Fault("c-f64-store-swapped", "src/kiln_endian.h",
          "uint64_t v; memcpy(&v, &f, 8); kiln_st_u64(p, v);",
          "uint64_t v; memcpy(&v, &f, 8); kiln_st_u64(p, kiln_bswap64(v));",
          VALUES, "the compiled encoder writes f64 scalars big-endian"),
]


def tracked_files():
    # tracked and new (not ignored) files, as they are in the work tree
    r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=ROOT, capture_output=True)
    if r.returncode != 0:   # an unpacked sdist or archive: every file but build output
        skip = {".git", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache"}
        files = []
        for d, dirs, names in os.walk(ROOT):
            dirs[:] = [x for x in dirs if x not in skip and not x.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names
                      if not n.endswith((".so", ".pyd", ".pyc"))]
        return sorted(files)
    files = [f for f in r.stdout.decode().split("\0") if f]
    return sorted({f for f in files if os.path.isfile(os.path.join(ROOT, f))})


def snapshot(dest):
    """The checkout as it is now (later edits to it do not reach a running check)."""
    for f in tracked_files():
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))
    for so in glob.glob(os.path.join(ROOT, "kiln", "_kernels_c*.so")) + \
            glob.glob(os.path.join(ROOT, "kiln", "_kernels_c*.pyd")):
        shutil.copy2(so, os.path.join(dest, "kiln", os.path.basename(so)))


def apply(fault, dest):
    p = os.path.join(dest, fault.path)
    with open(p) as f:
        text = f.read()
    n = text.count(fault.old)
    if n != 1:
        return "patch found %d times in %s (want 1)" % (n, fault.path)
    with open(p, "w") as f:
        f.write(text.replace(fault.old, fault.new))
    return None


def env_for(dest):
    env = dict(os.environ)
    env.pop("KILN_PUREPYTHON", None)
    env["PYTHONPATH"] = dest
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def build(dest):
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=dest,
                       env=env_for(dest), capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stdout + r.stderr)[-2000:]


def run_tests(dest, tests, stop_first=True):
    tests = [t for t in tests if os.path.exists(os.path.join(dest, t))]   # (an older tree)
    if not tests:
        return 5, 0, "no test file of this fault exists here", "", "-"
    cmd = [sys.executable, "-m", "pytest", *tests, "--c-extensions", "-q", "-p",
           "no:cacheprovider", "-p", "no:randomly"]
    if stop_first:
        cmd.append("-x")
    r = subprocess.run(cmd, cwd=dest, env=env_for(dest), capture_output=True, text=True)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|xfailed|xpassed)",
                                               tail)}
    ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "errors"))
    first = re.search(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)
    return r.returncode, ran, tail, r.stdout[-3000:], first.group(1) if first else "-"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="list the faults and exit")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these faults")
    ap.add_argument("--no-compiled", action="store_true", help="skip the faults in src/")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unpatched run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = ap.parse_args(argv)

    faults = FAULTS
    if args.only:
        unknown = set(args.only) - {f.name for f in FAULTS}
        if unknown:
            ap.error("unknown fault(s): %s" % ", ".join(sorted(unknown)))
        faults = [f for f in FAULTS if f.name in args.only]
    if args.no_compiled:
        faults = [f for f in faults if not f.path.startswith("src/")]
    if args.list:
        for f in faults:
            print("%-30s %-32s %s" % (f.name, f.path, f.what))
        return 0

    work = tempfile.mkdtemp(prefix="kiln-mutation-")
    rows, status = [], 0
    try:
        pristine = os.path.join(work, "pristine")
        snapshot(pristine)
        if not args.no_baseline:
            dest = pristine
            tests = sorted({t for f in faults for t in f.tests})
            t0 = time.time()
            rc, ran, tail, out, _ = run_tests(dest, tests, stop_first=False)
            print("baseline (unpatched): %d tests, %s (%.0f s)" % (ran, tail, time.time() - t0))
            if rc != 0:
                print(out)
                print("the unpatched tree fails its tests: fix that first")
                return 1
        for f in faults:
            dest = os.path.join(work, f.name)
            shutil.copytree(pristine, dest, symlinks=True)
            t0 = time.time()
            problem = apply(f, dest)
            if problem is None and f.path.startswith("src/"):
                problem = build(dest)
                problem = problem and "build failed: " + problem
            if problem is not None:
                rows.append((f.name, "-", "PATCH?", problem.strip().splitlines()[-1]))
                status = max(status, 2)
                continue
            rc, ran, tail, out, first = run_tests(dest, f.tests)
            caught = rc == 1 or (rc == 2 and "error" in tail)
            if args.verbose or not caught:
                print(out)
            rows.append((f.name, str(ran), "yes" if caught else "NO", first if caught else "-"))
            if not caught:
                status = max(status, 1)
            print("%-30s tests run %-5s caught %-4s by %s (%s; %.0f s)"
                  % (rows[-1] + (tail, time.time() - t0)), flush=True)
            if not args.keep:
                shutil.rmtree(dest, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("copies kept in", work)

    print()
    print("| fault | tests run | caught | first failing test |")
    print("| --- | ---: | --- | --- |")
    for name, ran, caught, first in rows:
        print("| %s | %s | %s | %s |" % (name, ran, caught, first))
    survivors = [r[0] for r in rows if r[2] != "yes"]
    print()
    print("all %d faults caught" % len(rows) if not survivors else
          "NOT caught: %s" % ", ".join(survivors))
    return status


if __name__ == "__main__":
    sys.exit(main())
