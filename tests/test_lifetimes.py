"""Views kiln hands out outlive every kiln object, and hold the caller's buffer (issue 11, part 1).

Every array or memoryview that points into the caller's buffer holds a
buffer export for its whole life, whatever it came through: ``Tensor.numpy()``,
``Tensor.data``, ``to_dict()``, iteration, indexing, slices of an array, a
directory inside a record or a list.  So, with every directory, tensor and
record deleted and ``gc.collect()`` run:

* the views still read exactly what was encoded;
* resizing a ``bytearray``, closing an ``mmap`` (also by leaving its ``with``
  block) or closing a ``multiprocessing.shared_memory.SharedMemory`` raises
  ``BufferError``, and succeeds once the views are gone;
* a ``bytes`` input is kept alive by the views and released after them;
* views of a writable buffer are read-only and cannot be made writable.

With ``copy=True`` the results do not hold the caller's buffer at all.

A view that lost its buffer crashes the interpreter when read, so each input
kind runs in a subprocess (``child_main`` below, one per kind and kernel):
a crash fails that test, not the run.  The child never reads a view whose
buffer a change was not refused for.
"""

import gc
import importlib.util
import mmap
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ["bytes", "bytearray", "mmap-anon", "mmap-file-read", "mmap-file-write",
         "shared_memory"]
DONE = "LIFETIMES-DONE"


# ---------------------------------------------------------------------------
# the parent side (pytest)


def _run_child(impl_name, kind, tmp_path):
    env = dict(os.environ)
    env["KILN_PUREPYTHON"] = "1" if impl_name == "python" else "0"
    code = ("import sys; sys.path.insert(0, %r); import test_lifetimes; "
            "sys.exit(test_lifetimes.child_main(sys.argv[1:]))" % HERE)
    kiln_dir = os.path.dirname(os.path.abspath(kiln.__file__))
    args = [sys.executable, "-c", code, impl_name, kind, str(tmp_path), kiln_dir]
    # cwd: a directory without a kiln package, so the child imports the caller's kiln
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=str(tmp_path), timeout=120)


def _describe(p):
    rc = p.returncode
    if rc < 0:
        try:
            how = "died of %s" % signal.Signals(-rc).name
        except ValueError:
            how = "died of signal %d" % -rc
    else:
        how = "exited with %d" % rc
    return "the child %s\n--- stdout\n%s--- stderr\n%s" % (how, p.stdout, p.stderr[-4000:])


@pytest.mark.parametrize("kind", KINDS)
def test_views_hold_the_buffer_after_every_kiln_object_is_gone(impl, kind, tmp_path):
    p = _run_child(impl.name, kind, tmp_path)
    fails = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL")]
    assert p.returncode == 0 and DONE in p.stdout and not fails, _describe(p)
    # every check ran, each view of every producer on its own
    oks = [ln for ln in p.stdout.splitlines() if ln.startswith("OK ")]
    checks = int(p.stdout.split(DONE)[1].split()[0])
    assert len(oks) == checks > 2 * len(PRODUCERS), _describe(p)
    if "h" not in RAW:   # every other view was checked
        pytest.skip("the bf16 tensor's views not checked: ml_dtypes is not installed "
                    "(a bf16 tensor has no .numpy() without it)")


# ---------------------------------------------------------------------------
# the inputs and what they must decode to

REC_TYPE = "struct{id:i64,batch:tensors,}"
LIST_TYPE = "list<opt<tensors>>"


def _originals():
    w = (np.arange(64 * 33, dtype=np.float32).reshape(64, 33) - 999.5) / 7
    tensors = {
        "w": kiln.Tensor.from_numpy(w),
        "b": kiln.Tensor.from_numpy(np.array([1, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1], bool)),
        "p": kiln.Tensor(kiln.pack_nibbles([1, 2, 3, 4, 5, 6, 7, 8, 9]), dtype="u4",
                         shape=[9]),
        "s": kiln.Tensor.from_numpy(np.array(-2.25, np.float64)),
        "h": kiln.Tensor(bytes.fromhex("803f0040c0bf0000807f"), dtype="bf16", shape=[5]),
        "o": kiln.Tensor(bytes(range(100, 108)), dtype=4096, shape=[2], layout="Q",
                         block_size=4),
        "z": kiln.Tensor(b"", dtype="i32", shape=[0, 3]),
    }
    if importlib.util.find_spec("ml_dtypes") is None:
        del tensors["h"]   # a bf16 tensor has no .numpy() without ml_dtypes: not in the views
    raw = {k: bytes(t.data) for k, t in tensors.items()}
    return w, tensors, raw


W, TENSORS, RAW = _originals()
CONTENT = {
    "dir": lambda: kiln.encode_tensors(TENSORS),
    "rec": lambda: kiln.encode({"id": 5, "batch": TENSORS}, REC_TYPE),
    "list": lambda: kiln.encode([None, TENSORS, {}], LIST_TYPE),
}


def _contig(a):
    return np.ascontiguousarray(a).tobytes()


# A producer decodes a buffer and returns (label, view, expected bytes) triples;
# every kiln object it made is gone when it returns (they are its locals).
# ``holds`` says whether its views must hold the caller's buffer.


PACKED = ("i4", "u4", "e2m1")   # numpy() is an unpacked copy; bits() views the payload


def _view(t):
    return t.bits() if t.dtype in PACKED else t.numpy()


def p_numpy(buf):
    a = kiln.decode_tensors(buf)["w"].numpy()
    return [("numpy", a, RAW["w"])]


def p_data(buf):
    # a control: .data held a buffer export even before issue 11
    return [("data", kiln.decode_tensors(buf)["w"].data, RAW["w"])]


def p_to_dict(buf):
    d = kiln.decode_tensors(buf).to_dict()
    return [("to_dict[%s]" % k, v, RAW[k]) for k, v in d.items() if k not in ("z", "p")]


def p_iteration(buf):
    out = []
    for t in kiln.decode_tensors(buf).values():
        if t.nbytes:
            out.append(("iter %s .numpy()" % t.name, _view(t), RAW[t.name]))
            out.append(("iter %s .data" % t.name, t.data, RAW[t.name]))
    return out


def p_slices(buf):
    a = kiln.decode_tensors(buf)["w"].numpy()
    return [("numpy[1:, ::2]", a[1:, ::2], _contig(W[1:, ::2])),
            ("numpy.T", a.T, _contig(W.T)),
            ("numpy.reshape(-1)[5:9]", a.reshape(-1)[5:9], _contig(W.reshape(-1)[5:9])),
            ("numpy.view(uint8)", a.view(np.uint8), RAW["w"]),
            ("numpy[3]", a[3], _contig(W[3])),
            ("data[8:40]", kiln.decode_tensors(buf)["w"].data[8:40], RAW["w"][8:40])]


def p_indexing(buf):
    d = kiln.decode_tensors(buf)
    names = d.names
    out = [("d[0].numpy()", d[0].numpy(), RAW[names[0]]),
           ("d[-2].data", d[-2].data, RAW[names[-2]]),
           ("d.get('b').numpy()", d.get("b").numpy(), RAW["b"])]
    out += [("d[0:2][%d].numpy()" % i, t.numpy(), RAW[t.name]) for i, t in enumerate(d[0:2])]
    return out


def p_dtypes(buf):
    d = kiln.decode_tensors(buf)
    return [("%s .numpy()" % k, d[k].numpy(), RAW[k]) for k in ("b", "s", "h", "o")
            if k in RAW] + [("p .bits()", d["p"].bits(), RAW["p"])]


def p_decoder(buf):
    a = kiln.Decoder(kiln.tensors).decode(buf)["w"].numpy()
    return [("Decoder(tensors) numpy", a, RAW["w"])]


def p_record(buf):
    a = kiln.decode(buf, kiln.parse_type(REC_TYPE))["batch"]["w"].numpy()
    k = "h" if "h" in RAW else "o"
    t = kiln.decode(buf, REC_TYPE)["batch"][k]
    return [("record ['batch']['w'].numpy()", a, RAW["w"]),
            ("record ['batch'][%r].data" % k, t.data, RAW[k])]


def p_list(buf):
    v = kiln.decode(buf, LIST_TYPE)
    return [("list [1]['w'].numpy()", v[1]["w"].numpy(), RAW["w"]),
            ("list [1]['p'].data", v[1]["p"].data, RAW["p"])]


def p_copy(buf):
    d = kiln.decode_tensors(buf, copy=True)
    out = [("copy to_dict[%s]" % k, v, RAW[k]) for k, v in d.to_dict().items()
           if k not in ("z", "p")]
    out.append(("copy .data", d["w"].data, RAW["w"]))
    return out


# name -> (function, content, holds the buffer)
PRODUCERS = {
    "numpy": (p_numpy, "dir", True),
    "data": (p_data, "dir", True),
    "to_dict": (p_to_dict, "dir", True),
    "iteration": (p_iteration, "dir", True),
    "slices": (p_slices, "dir", True),
    "indexing": (p_indexing, "dir", True),
    "dtypes": (p_dtypes, "dir", True),
    "decoder": (p_decoder, "dir", True),
    "record": (p_record, "rec", True),
    "list": (p_list, "list", True),
    "copy": (p_copy, "dir", False),
}


# ---------------------------------------------------------------------------
# the inputs, one class per kind


class Source:
    """A caller's buffer holding ``data``; ``arg`` is what is passed to kiln."""

    writable = True

    def change(self):
        """Try every change a live view must block; the names of those that happened."""
        raise NotImplementedError

    def free(self):
        """Resize or close it; raises if that is refused."""
        raise NotImplementedError

    def cleanup(self):
        pass


class BytesSource(Source):
    writable = False

    def __init__(self, data, tmp):
        self.arg = bytes(bytearray(data))  # a private object, not an interned one

    def change(self):
        return []  # immutable: nothing to refuse (checked in _sanity)

    def free(self):
        pass


class BytearraySource(Source):
    def __init__(self, data, tmp):
        self.arg = bytearray(data)

    def change(self):
        done = []
        for what, op in (("bytearray.extend", lambda: self.arg.extend(bytes(4096))),
                         ("bytearray.clear", self.arg.clear),
                         ("del bytearray[:8]", lambda: self.arg.__delitem__(slice(0, 8)))):
            try:
                op()
            except BufferError:
                continue
            done.append(what)
            break  # the views may now dangle: try nothing more
        return done

    def free(self):
        self.arg.clear()


class _MmapSource(Source):
    def change(self):
        done = []
        try:
            self.m.resize(len(self.m) + mmap.PAGESIZE)
        except BufferError:
            pass
        except (TypeError, OSError, SystemError, ValueError):
            pass  # this map cannot be resized at all: close() is the test
        else:
            return ["mmap.resize"]
        try:
            self.m.close()
        except BufferError:
            pass
        else:
            done.append("mmap.close")
        return done

    def free(self):
        self.m.close()

    def cleanup(self):
        if hasattr(self, "f"):
            self.f.close()


class AnonMmapSource(_MmapSource):
    def __init__(self, data, tmp):
        self.m = self.arg = mmap.mmap(-1, len(data))
        self.m[:] = data


class FileMmapSource(_MmapSource):
    counter = 0

    def __init__(self, data, tmp, write):
        FileMmapSource.counter += 1
        path = os.path.join(tmp, "in%d.kiln" % FileMmapSource.counter)
        with open(path, "wb") as fh:
            fh.write(data)
        self.writable = write
        self.f = open(path, "r+b" if write else "rb")
        self.m = self.arg = mmap.mmap(self.f.fileno(), 0,
                                      access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)


class SharedMemorySource(Source):
    def __init__(self, data, tmp):
        from multiprocessing import shared_memory
        self.shm = shared_memory.SharedMemory(create=True, size=len(data))
        try:
            self.shm.buf[:len(data)] = data
            # the buffer the caller passes; a slice where the size was rounded up
            self.arg = self.shm.buf if self.shm.size == len(data) else self.shm.buf[:len(data)]
        except BaseException:
            self.cleanup()
            raise

    def change(self):
        try:
            self.shm.close()
        except BufferError:
            return []
        return ["SharedMemory.close"]

    def free(self):
        if self.arg is not self.shm.buf:
            self.arg.release()
        self.shm.close()

    def cleanup(self):
        try:
            self.shm.close()
        except BufferError:
            pass
        finally:
            self.shm.unlink()


def make_source(kind, data, tmp):
    if kind == "bytes":
        return BytesSource(data, tmp)
    if kind == "bytearray":
        return BytearraySource(data, tmp)
    if kind == "mmap-anon":
        return AnonMmapSource(data, tmp)
    if kind == "mmap-file-read":
        return FileMmapSource(data, tmp, False)
    if kind == "mmap-file-write":
        return FileMmapSource(data, tmp, True)
    if kind == "shared_memory":
        return SharedMemorySource(data, tmp)
    raise ValueError(kind)


# ---------------------------------------------------------------------------
# the child side


class _Report:
    def __init__(self):
        self.failures = 0

    def fail(self, check, msg):
        self.failures += 1
        line = "FAIL %s: %s" % (check, msg)
        print(line, flush=True)
        return line

    def ok(self, check):
        print("OK %s" % check, flush=True)


def _bytes_of(v):
    return v.tobytes(order="C")


def _wrong_values(views):
    for label, v, want in views:
        got = _bytes_of(v)
        if got != want:
            return "%s reads %d bytes %s..., %d bytes %s... were encoded" % (
                label, len(got), got[:16].hex(), len(want), want[:16].hex())
    return None


def _writable_views(views):
    """Views that can be written or made writable: a list of descriptions."""
    out = []
    for label, v, _ in views:
        if isinstance(v, memoryview):
            if not v.readonly:
                out.append("%s is a writable memoryview" % label)
                continue
            if v.nbytes:
                b = v.cast("B") if (v.format != "B" or v.ndim != 1) else v
                try:
                    b[0] = (b[0] + 1) & 0xFF
                except TypeError:
                    pass
                else:
                    out.append("%s: writing through it changed the caller's buffer" % label)
        else:
            if v.flags.writeable:
                out.append("%s is a writeable array" % label)
                continue
            try:
                v.flags.writeable = True
            except ValueError:
                pass
            else:
                out.append("%s: flags.writeable = True succeeded" % label)
    return out


def _check(rep, kind, name, keep, tmp):
    """One producer on a fresh input; only its view number ``keep`` is kept
    (all of them for copies: none may hold the buffer)."""
    func, content, holds = PRODUCERS[name]
    src = make_source(kind, CONTENT[content](), tmp)
    check = "%s/%s" % (kind, name)
    try:
        base = sys.getrefcount(src.arg) if kind == "bytes" else None
        arg = src.arg
        views = func(arg)
        del arg
        if holds:
            views = [views[keep]]  # the other views must not be what holds the buffer
            check += " " + views[0][0]
        gc.collect()
        bad = _wrong_values(views)
        if bad:
            return rep.fail(check, "before any change: " + bad)
        if not holds:
            # copies: the caller's buffer is free while they live
            if kind == "bytes" and sys.getrefcount(src.arg) != base:
                return rep.fail(check, "copy=True results hold a reference to the bytes")
            try:
                src.free()
            except BufferError as e:
                return rep.fail(check, "copy=True results hold the caller's buffer: %s" % e)
            gc.collect()
            bad = _wrong_values(views)
            if bad:
                return rep.fail(check, "after the buffer was freed: " + bad)
            return rep.ok(check)
        failed = False
        if src.writable:
            bad = _writable_views(views)
            if bad:
                rep.fail(check, "; ".join(bad))
                failed = True  # and go on: does it hold the buffer?
        done = src.change()
        if done:
            # the view may point at freed memory now: never read it again
            return rep.fail(check, "%s succeeded while the view lived" % " and ".join(done))
        bad = _wrong_values(views)
        if bad:
            return rep.fail(check, "after the refused change: " + bad)
        if kind == "bytes":
            if sys.getrefcount(src.arg) <= base:
                # reading it after the caller lets go could crash: stop here
                return rep.fail(check, "the view holds no reference to the bytes object")
            src.arg = None  # the caller lets go: the view alone keeps the bytes
            gc.collect()
            bad = _wrong_values(views)
            if bad:
                return rep.fail(check, "after the caller dropped the bytes: " + bad)
            return None if failed else rep.ok(check)
        del views
        gc.collect()
        try:
            src.free()
        except BufferError as e:
            return rep.fail(check, "an export outlived the view: %s" % e)
        return None if failed else rep.ok(check)
    finally:
        views = None
        gc.collect()
        src.cleanup()


def _check_with_statement(rep, kind, key, tmp):
    """``with mmap.mmap(...) as m: w = kiln.decode_tensors(m).to_dict()[key]``, then use ``w``."""
    check = "%s/with-statement to_dict()[%r]" % (kind, key)
    path = os.path.join(tmp, "with.kiln")
    with open(path, "wb") as fh:
        fh.write(CONTENT["dir"]())
    write = kind == "mmap-file-write"
    with open(path, "r+b" if write else "rb") as fh:
        m = None
        try:
            with mmap.mmap(fh.fileno(), 0,
                           access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ) as m:
                w = kiln.decode_tensors(m).to_dict()[key]
                gc.collect()
        except BufferError:
            pass
        else:
            del w
            return rep.fail(check, "leaving the with block closed the mmap under the array")
        bad = _wrong_values([(key, w, RAW[key])])
        if bad:
            return rep.fail(check, bad)
        del w
        gc.collect()
        try:
            m.close()
        except BufferError as e:
            return rep.fail(check, "an export outlived the array: %s" % e)
        return rep.ok(check)


def _check_bytes_released(rep):
    """Once the views are gone, no reference to a bytes input is left behind."""
    check = "bytes/released"
    b = bytes(bytearray(CONTENT["dir"]()))
    r = bytes(bytearray(CONTENT["rec"]()))
    lst = bytes(bytearray(CONTENT["list"]()))
    inputs = {"dir": b, "rec": r, "list": lst}
    base = {k: sys.getrefcount(inputs[k]) for k in inputs}
    for name, (func, content, _) in PRODUCERS.items():
        views = func(inputs[content])
        del views
        gc.collect()
        got = sys.getrefcount(inputs[content])
        if got != base[content]:
            return rep.fail(check, "%s left %d references to the bytes"
                            % (name, got - base[content]))
    return rep.ok(check)


def _sanity(rep):
    # bytes cannot be changed through a buffer, whatever kiln does
    b = bytes(8)
    try:
        memoryview(b)[0] = 1
    except TypeError:
        pass
    else:
        rep.fail("sanity", "a bytes object was written through a memoryview")


def child_main(argv):
    impl_name, kind, tmp, kiln_dir = argv
    here = os.path.dirname(os.path.abspath(kiln.__file__))
    if os.path.realpath(here) != os.path.realpath(kiln_dir):
        print("FAIL setup: the child imported kiln from %s, the test from %s"
              % (here, kiln_dir), flush=True)
        return 1
    if kiln.IMPLEMENTATION != impl_name:
        print("FAIL setup: kiln.IMPLEMENTATION is %r, wanted %r"
              % (kiln.IMPLEMENTATION, impl_name), flush=True)
        return 1
    rep = _Report()
    _sanity(rep)
    # what exists now is not garbage: keep it out of every gc.collect() below
    gc.collect()
    gc.freeze()
    checks = 0
    for name, (func, content, holds) in PRODUCERS.items():
        # how many views the producer returns (a bytes input: nothing to free)
        count = len(func(CONTENT[content]())) if holds else 1
        gc.collect()
        for keep in range(count):
            checks += 1
            try:
                _check(rep, kind, name, keep, tmp)
            except Exception as e:  # noqa: BLE001 - report and go on with the next check
                rep.fail("%s/%s #%d" % (kind, name, keep),
                         "raised %s: %s" % (type(e).__name__, e))
    if kind == "bytes":
        checks += 1
        _check_bytes_released(rep)
    if kind.startswith("mmap-file"):
        for key in sorted(RAW):
            if not RAW[key] or key == "p":   # (p's to_dict() array is a copy: nothing held)
                continue
            checks += 1
            try:
                _check_with_statement(rep, kind, key, tmp)
            except Exception as e:  # noqa: BLE001
                rep.fail("%s/with-statement %r" % (kind, key),
                         "raised %s: %s" % (type(e).__name__, e))
    print("%s %d checks, %d failures" % (DONE, checks, rep.failures), flush=True)
    return 1 if rep.failures else 0
