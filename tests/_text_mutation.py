"""Strings decoded while another process or thread rewrites them (issue 26,
point 1): the harness of tests/test_shared_strings.py and
tools/text-mutation-stress.py.

A list of records whose strings are long ASCII, long and short non-ASCII,
one byte, and a dict key sits in a buffer; a writer keeps replacing every
string's bytes with another of its variants (all of one string's variants
have the same UTF-8 length, so the lengths never change) and with invalid
UTF-8, while the decoder decodes the buffer again and again.

``fork`` mode
    The buffer is an anonymous ``MAP_SHARED`` mmap; a forked child writes.
    Its writes and the decoder's copies run at the same time, so a string
    may be read half old, half new: a result string must be a valid ``str``
    (``isascii()`` agrees with its characters, its UTF-8 round-trips, it has
    the written length) and each of its bytes one that was written at that
    position.
``thread`` mode
    The buffer is a ``bytearray`` a second thread writes.  A write is one
    slice assignment, so a string must be exactly one of the variants.

Anything but a result that passes or a ``kiln.KilnError`` is a failure.  A
run happens in a worker subprocess (``run_worker``), so a crash fails the
run instead of its caller; the worker kills and reaps its child, the child
dies with the worker (PR_SET_PDEATHSIG on Linux) or after a deadline, and
``run_worker`` kills it if it is still there.
"""

import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))

TYPE = "list<struct{pad:u8,long:str,huge:str,mixed:str,one:str,key:dict<str,u8>,}>"
RECORDS = 4

# every variant of a string, as bytes of one length; the valid ones first
VALID = {
    "long": ["a" * 300, "é" * 150, "aé" * 100],
    "huge": ["h" * 3000, "é" * 1500],
    "mixed": ["m" * 90, "ü" * 45, "x€" * 22 + "yy"],
    "one": ["a", "z"],
    "key": ["k" * 12, "é" * 6, "€€€€"],
}
# (mostly 1- and 2-byte characters: half of the reads torn between two
# variants are still valid UTF-8, so many decodes pass while the bytes move)
INVALID = {"long": [b"\xe1" * 300, b"a" * 299 + b"\xff"], "huge": [b"\xe1" * 3000],
           "mixed": [b"\xe1" * 90],
           "one": [b"\xe1"], "key": [b"\xe1" * 12]}
SLOTS = tuple(VALID)


def value(j=0):
    """The records with every string's j-th valid variant."""
    def pick(slot):
        return VALID[slot][j % len(VALID[slot])]
    return [{"pad": 7, "long": pick("long"), "huge": pick("huge"), "mixed": pick("mixed"),
             "one": pick("one"), "key": {pick("key"): 1}} for _ in range(RECORDS)]


def layout():
    """(the valid input, [(offset, slot)] of every string's bytes)."""
    data = kiln.encode(value(), TYPE)
    where = []
    p = 4
    for _ in range(RECORDS):
        p += 1                     # pad
        for slot in ("long", "huge", "mixed", "one"):
            where.append((p + 4, slot))
            p += 4 + len(VALID[slot][0].encode())
        where.append((p + 8, "key"))   # count, key length, key bytes, u8
        p += 8 + len(VALID["key"][0].encode()) + 1
    assert p == len(data)
    for off, slot in where:
        assert data[off:off + len(VALID[slot][0].encode())] == VALID[slot][0].encode()
    return data, where


def variants(slot, invalid=True):
    for v in VALID[slot]:
        yield v.encode()
    if invalid:
        yield from INVALID[slot]


class Checker:
    def __init__(self, exact):
        self.exact = exact
        self.valid = {slot: frozenset(VALID[slot]) for slot in SLOTS}
        # fork mode: the bytes written at each position of each string (one row a variant)
        self.written = {slot: np.array([np.frombuffer(v, np.uint8) for v in variants(slot)])
                        for slot in SLOTS}

    def string(self, slot, s):
        """None when ``s`` is a string this slot may decode to, else why not."""
        if type(s) is not str:
            return "a %s, not a str" % type(s).__name__
        if s.isascii() != (max(map(ord, s), default=0) < 128):
            return "invalid str: isascii() is %s, its characters say otherwise (%r)" % (
                s.isascii(), s.encode("utf-8", "surrogatepass")[:24])
        try:
            b = s.encode("utf-8")
            same = b.decode("utf-8") == s
        except UnicodeError as e:
            return "invalid str: its UTF-8 does not round-trip (%s)" % e
        if not same:
            return "invalid str: its UTF-8 decodes to another str"
        if self.exact:
            return None if s in self.valid[slot] else "never written: %r" % s[:24]
        rows = self.written[slot]
        if len(b) != rows.shape[1]:
            return "%d UTF-8 bytes, %d were written" % (len(b), rows.shape[1])
        seen = (rows == np.frombuffer(b, np.uint8)).any(axis=0)
        if not seen.all():
            i = int(np.argmin(seen))
            return "byte %d is 0x%02x, never written there" % (i, b[i])
        return None

    def problem(self, res):
        if type(res) is not list or len(res) != RECORDS:
            return "mismatch: %r" % (res,)
        for r in res:
            if r["pad"] != 7 or len(r["key"]) != 1 or list(r["key"].values()) != [1]:
                return "mismatch: %r" % (r,)
            for slot in SLOTS:
                s = next(iter(r["key"])) if slot == "key" else r[slot]
                bad = self.string(slot, s)
                if bad:
                    return "%s: %s" % (slot, bad)
        return None


def _writer(write, where, stop):
    """Cycle every string through its variants; the first record's through
    the invalid ones too (every record's would leave few decodes that pass)."""
    first = len(where) // RECORDS
    seqs = [(off, list(variants(slot, i < first))) for i, (off, slot) in enumerate(where)]
    k = 0
    while not stop():
        for _ in range(64):
            for off, vs in seqs:
                v = vs[k % len(vs)]
                write(off, v)
            k += 1


def _die_with_parent():
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - the deadline below still applies
            pass


def _decode_loop(dec, buf, check, seconds):
    stats = {"decodes": 0, "ok": 0, "kiln_error": 0, "failures": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            stats["decodes"] += 1
            try:
                res = dec.decode(buf)
            except kiln.KilnError:
                stats["kiln_error"] += 1
                continue
            except Exception as e:  # noqa: BLE001 - anything else is a failure
                bad = "%s: %s" % (type(e).__name__, e)
            else:
                try:
                    bad = check.problem(res)
                except Exception as e:  # noqa: BLE001
                    bad = "checking the result raised %s: %s" % (type(e).__name__, e)
            if bad is None:
                stats["ok"] += 1
            elif len(stats["failures"]) < 10:
                stats["failures"].append(bad)
                print("FAIL " + bad, flush=True)   # seen even if a crash follows
    return stats


def run_fork(kernels, seconds):
    data, where = layout()
    m = mmap.mmap(-1, len(data), flags=mmap.MAP_SHARED)
    m[:] = data
    dec = kiln.Decoder(TYPE, kernels=kernels)
    deadline = time.monotonic() + seconds + 60
    parent = os.getpid()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _die_with_parent()

            def write(off, v):
                m[off:off + len(v)] = v

            _writer(write, where, lambda: time.monotonic() > deadline or
                    os.getppid() != parent)
        finally:
            os._exit(0)
    print("CHILD %d" % pid, flush=True)
    try:
        stats = _decode_loop(dec, m, Checker(False), seconds)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    m[:] = data
    stats["final"] = Checker(True).problem(dec.decode(m))
    return stats


def run_thread(kernels, seconds):
    data, where = layout()
    ba = bytearray(data)
    dec = kiln.Decoder(TYPE, kernels=kernels)
    done = threading.Event()

    def write(off, v):
        ba[off:off + len(v)] = v   # same length: allowed while exported

    th = threading.Thread(target=_writer, args=(write, where, done.is_set), daemon=True)
    th.start()
    # with the GIL a slice assignment is atomic, so each string is one variant
    # exactly; with the GIL off (a free-threaded build) the writer's copy runs
    # beside kiln's and a string may mix two variants byte by byte: it must
    # still be a valid str of bytes written at those positions (fork mode's rule)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    try:
        stats = _decode_loop(dec, ba, Checker(gil), seconds)
    finally:
        done.set()
        th.join()
    ba[:] = data
    stats["final"] = Checker(True).problem(dec.decode(ba))
    return stats


def worker_main(argv):
    mode, seconds, impl_name = argv[:3]
    if impl_name == "python":
        from kiln import _kernels_py as kernels
    else:
        import importlib
        kernels = importlib.import_module("kiln._kernels_c")
    stats = (run_fork if mode == "fork" else run_thread)(kernels, float(seconds))
    print("RESULT " + json.dumps(stats), flush=True)


def _token_alive(pid, token):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return token.encode() in fh.read()
    except OSError:
        return False


def run_worker(mode, seconds, impl_name, timeout=None):
    """Run one worker; returns (returncode, stats or None, output)."""
    token = "kiln-text-mutation-" + uuid.uuid4().hex
    code = ("import sys; sys.path.insert(0, %r); import _text_mutation as m; "
            "m.worker_main(sys.argv[1:])" % HERE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.Popen([sys.executable, "-c", code, mode, str(seconds), impl_name, token],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout or 3 * seconds + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    finally:
        for line in (out if proc.returncode is not None else "").splitlines():
            if line.startswith("CHILD "):
                pid = int(line.split()[1])
                if _token_alive(pid, token):
                    os.kill(pid, signal.SIGKILL)
    stats = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            stats = json.loads(line[7:])
    return proc.returncode, stats, out
