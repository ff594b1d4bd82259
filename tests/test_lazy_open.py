"""A lazy open costs what it reads (issue 26.2, 27.6), and kiln reads only
regular files and URLs (issue 27.14).

``kiln.open`` checks everything the table decides; a tensor's payload
contents are checked by the kernel's ``check_payload`` when that tensor is
read.  The resource tests open, in a fresh subprocess, a sparse file holding
a 4-element f32 tensor beside a bool tensor that claims 1 GiB, then the
same file with a 1 KiB bool tensor, read only the small tensor, and compare
minor page faults, peak RSS and (over HTTP) the bytes the server sent: they
must not depend on the claim.  Resource counts, not times.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

from _servers import RangeServer
from _util import ROOT

GiB = 1 << 30
FAULT_SLACK = 400            # pages: a fault count may differ this much between two runs
RSS_SLACK = 16 << 20


def _sparse(path, n_bool):
    """``big`` (bool, a hole: zeros) then ``a`` (4 f32) then ``tail`` (3 u4)."""
    with kiln.TensorWriter(path) as w:
        w.add("big", "bool", (n_bool,))
        w.add("a", "f32", (4,))
        w.add("tail", "u4", (3,))
        w.write("big", None)
        w.write("a", np.arange(4, dtype=np.float32))
        w.write("tail", kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,)))


_CHILD = r"""
import json, resource, sys
import numpy as np
import kiln
src = sys.argv[1]
with kiln.open(sys.argv[2]) as f:    # warm: every module and cache a read uses
    f["a"].numpy()
r0 = resource.getrusage(resource.RUSAGE_SELF)
with kiln.open(src) as f:
    x = f["a"].numpy().tolist()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"faults": r1.ru_minflt - r0.ru_minflt, "maxrss": r1.ru_maxrss * 1024,
                  "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "x": x,
                  "impl": kiln.IMPLEMENTATION}))
"""


def _measure(impl, src, warm):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl == "python" else "0")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(warm)], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["impl"] == impl and out["x"] == [0.0, 1.0, 2.0, 3.0]
    return out


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    _sparse(root / "big.kiln", GiB)
    _sparse(root / "small.kiln", 1024)
    _sparse(root / "mid.kiln", 128 << 10)   # past the first 64 KiB request, as big is
    _sparse(root / "warm.kiln", 16)
    assert os.path.getsize(root / "big.kiln") > GiB
    return root


def _report(what, big, small, sent=None):
    line = "%s: faults %d vs %d, peak RSS %.1f vs %.1f MiB, cpu %.3f vs %.3f s" % (
        what, big["faults"], small["faults"], big["maxrss"] / 2 ** 20,
        small["maxrss"] / 2 ** 20, big["cpu"], small["cpu"])
    if sent:
        line += ", sent %d vs %d bytes" % sent
    print(line)


def test_open_and_one_small_tensor_cost_the_same_beside_a_1_gib_claim(impl, sparse_files):
    big = _measure(impl.name, sparse_files / "big.kiln", sparse_files / "warm.kiln")
    small = _measure(impl.name, sparse_files / "small.kiln", sparse_files / "warm.kiln")
    _report("local " + impl.name, big, small)
    assert abs(big["faults"] - small["faults"]) < FAULT_SLACK, (big, small)
    assert abs(big["maxrss"] - small["maxrss"]) < RSS_SLACK, (big, small)


def test_over_http_the_cost_does_not_depend_on_the_claim_either(impl, sparse_files):
    with RangeServer(sparse_files) as server:
        out = {}
        for name in ("big", "mid"):   # both longer than the first request
            with server.lock:
                server.sent = 0
            out[name] = _measure(impl.name, server.url + name + ".kiln",
                                 server.url + "warm.kiln")
            with server.lock:
                out[name]["sent"] = server.sent
    big, small = out["big"], out["mid"]
    _report("http " + impl.name, big, small, (big["sent"], small["sent"]))
    assert abs(big["faults"] - small["faults"]) < FAULT_SLACK, (big, small)
    assert abs(big["maxrss"] - small["maxrss"]) < RSS_SLACK, (big, small)
    # the same bytes but for the digits of the headers (the total size, the ETag)
    assert abs(big["sent"] - small["sent"]) < 256 and big["sent"] < (80 << 10), (big, small)


def test_a_claimed_metadata_length_costs_what_its_decode_reads(api, tmp_path):
    """A ``__metadata__`` payload claiming 64 MiB of zeros: the open reads no
    metadata; its first read refuses the frame without copying the claim
    first (a window of the payload is read at a time)."""
    import tracemalloc
    meta = kiln.Tensor(bytes(64 << 20), dtype="u8", shape=(64 << 20,), name="__metadata__")
    data = kiln.encode_tensors([kiln.Tensor.from_numpy(np.ones(2, np.float32), name="a"), meta])
    (tmp_path / "m.kiln").write_bytes(data)
    d = kiln.decode_tensors(data)
    at = d._pb + d._rows[1][10]                    # the metadata payload's first byte
    del data, meta, d
    tracemalloc.start()
    try:
        f = kiln.open(tmp_path / "m.kiln")
        assert f.keys() == ["a"]   # the table alone: no metadata read
        with pytest.raises(kiln.KilnError) as e:
            f.metadata
        peak = tracemalloc.get_traced_memory()[1]
        f.close()
    finally:
        tracemalloc.stop()
    assert (e.value.code, e.value.offset) == ("FRAME", at), e.value
    assert peak < (4 << 20), peak


# --- the checks still run: when the tensor is read, at the offset the full check gives ----

def _with_fault(tmp_path, what):
    t = {"a": np.ones(3, np.float32), "b": np.array([True, False, True]),
         "n": kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,)),
         "z": np.arange(5, dtype=np.int16)}
    data = bytearray(kiln.encode_tensors(t))
    d = kiln.decode_tensors(bytes(data))
    off = {k: d._pb + d._rows[i][10] for i, k in enumerate(d.keys())}
    if what == "bool":
        data[off["b"] + 2] = 7
        name = "b"
    elif what == "nibble":
        data[off["n"] + 1] |= 0x40
        name = "n"
    else:
        data[off["a"] + 12] = 1          # the gap after a's 12 bytes
        name = "a"
    p = tmp_path / ("%s.kiln" % what)
    p.write_bytes(bytes(data))
    return p, bytes(data), name


@pytest.mark.parametrize("what", ["bool", "nibble", "gap"])
def test_a_bad_payload_is_refused_when_its_tensor_is_read(api, tmp_path, what):
    p, data, name = _with_fault(tmp_path, what)
    with pytest.raises(kiln.KilnError) as full:
        api.decode_tensors(data)
    for load in (kiln.load_tensors, lambda q: kiln.load_tensors(q, copy=True)):
        with pytest.raises(kiln.KilnError) as e:
            load(p)                                  # up front, as before
        assert (e.value.code, e.value.offset) == (full.value.code, full.value.offset)
    with kiln.open(p) as f:                          # the open decides the table only
        assert f.keys() == ["a", "b", "n", "z"]
        for k in f.keys():
            if k != name:
                f[k].numpy()                         # the others read fine
        for read in (lambda: f[name], lambda: f.tensors(), lambda: f[0:4],
                     lambda: f.rows(name, 0, 3)):
            with pytest.raises(kiln.KilnError) as e:
                read()
            assert (e.value.code, e.value.offset) == (full.value.code, full.value.offset)
    assert full.value.code == "TYPE"


def test_rows_check_only_the_rows_they_read(api, tmp_path):
    flags = np.zeros(1000, bool)
    kiln.save_tensors(tmp_path / "r.kiln", {"f": flags, "x": np.ones(2, np.float32)})
    data = bytearray((tmp_path / "r.kiln").read_bytes())
    d = kiln.decode_tensors(bytes(data))
    at = d._pb + d._rows[0][10]
    data[at + 900] = 3
    (tmp_path / "r.kiln").write_bytes(bytes(data))
    with kiln.open(tmp_path / "r.kiln") as f:
        assert f.rows("f", 0, 900).sum() == 0       # rows before the bad byte
        with pytest.raises(kiln.KilnError) as e:
            f.rows("f", 850, 950)
        assert (e.value.code, e.value.offset) == ("TYPE", at + 900)
        with pytest.raises(kiln.KilnError):
            f["f"]
        assert f["x"].numpy().tolist() == [1.0, 1.0]


class _Drift:
    """An index that says ``first`` once and ``then`` afterwards."""

    def __init__(self, first, then):
        self.values = [first, then]

    def __index__(self):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_rows_read_their_bounds_once_before_the_check(api, tmp_path):
    # issue 38 item 13: a stop that says 1 to the check and 8 to the slice
    # handed out rows 1..7 (a bad byte among them) never checked
    flags = np.zeros((8, 4), bool)
    kiln.save_tensors(tmp_path / "r.kiln", {"f": flags})
    data = bytearray((tmp_path / "r.kiln").read_bytes())
    d = kiln.decode_tensors(bytes(data))
    at = d._pb + d._rows[0][10]
    data[at + 6 * 4 + 1] = 3                        # row 6
    (tmp_path / "r.kiln").write_bytes(bytes(data))
    with kiln.open(tmp_path / "r.kiln") as f:
        assert f.rows("f", 0, _Drift(1, 1)).shape == (1, 4)
        with pytest.raises(kiln.KilnError) as e:
            f.rows("f", 6, 7)
        assert (e.value.code, e.value.offset) == ("TYPE", at + 25)
    with kiln.open(tmp_path / "r.kiln") as f:
        got = f.rows("f", _Drift(0, 0), _Drift(1, 8))
        assert got.shape == (1, 4) and not got.any()   # stop read once: 1
        with pytest.raises(TypeError):
            f.rows("f", 0, 2.0)
        with pytest.raises(kiln.KilnError) as e:
            f.rows("f", 0, 8)
        assert (e.value.code, e.value.offset) == ("TYPE", at + 25)


def test_check_payload_is_the_same_in_both_kernels(impl):
    from kiln import _wire as W
    k, b1, u4, u8 = impl.kernels, W.DTYPE_BOOL, W.DTYPE_CODES["u4"], W.DTYPE_CODES["u8"]
    k.check_payload(b"\x00\x01\x01", 0, b1, 3, 3, 100)
    with pytest.raises(kiln.KilnError) as e:
        k.check_payload(b"\x00\x01\x02\x00", 0, b1, 4, 4, 100)
    assert (e.value.code, e.value.offset) == ("TYPE", 102)
    with pytest.raises(kiln.KilnError) as e:        # a piece: positions 5.. of the payload
        k.check_payload(b"\x00\x09", 5, b1, 8, 8, 100)
    assert (e.value.code, e.value.offset) == ("TYPE", 106)
    k.check_payload(b"\x21\xf0", 0, u4, 4, 2, 0)     # an even count: the tail is data
    with pytest.raises(kiln.KilnError) as e:
        k.check_payload(b"\x21\x13\x00", 0, u4, 3, 2, 64)
    assert (e.value.code, e.value.offset) == ("TYPE", 65)
    k.check_payload(b"\x21", 0, u4, 3, 2, 64)         # the tail is not in this piece
    with pytest.raises(kiln.KilnError) as e:        # gap bytes after the payload
        k.check_payload(b"\x01\x00\x00\x05", 0, u8, 1, 1, 64)
    assert (e.value.code, e.value.offset, "gap" in e.value.reason) == ("TYPE", 67, True)
    k.check_payload(b"\x00\x00", 1, b1, 1, 1, 0)      # from position 1 on: the gap
    with pytest.raises(kiln.KilnError) as e:
        k.check_payload(b"\x00\x02", 1, b1, 1, 1, 0)
    assert (e.value.code, e.value.offset) == ("TYPE", 2)
    big = np.zeros(3 << 20, np.uint8)
    big[(3 << 20) - 5] = 2                           # past the pure kernel's first chunks
    with pytest.raises(kiln.KilnError) as e:
        k.check_payload(big, 0, b1, big.size, big.size, 64)
    assert (e.value.code, e.value.offset) == ("TYPE", 64 + (3 << 20) - 5)
    with pytest.raises(ValueError):
        k.check_payload(b"", -1, b1, 1, 1, 0)


def test_check_header_refuses_before_the_table_is_read(impl):
    data = bytearray(kiln.encode_tensors({"a": np.ones(4, np.float32)}))
    assert impl.kernels.check_header(bytes(data), 0, 100, 1000) == 256   # 64 + 128 + 1, aligned
    data[4] = 3
    with pytest.raises(kiln.KilnError) as e:
        impl.kernels.check_header(bytes(data[:64]) + bytes(len(data) - 64), 0, 100, 1000)
    assert (e.value.code, e.value.offset) == ("FRAME", 4)


# --- FIFOs, sockets and devices are refused without waiting on them --------------------

_FIFO_CHILD = r"""
import sys, kiln
path, how = sys.argv[1], sys.argv[2]
try:
    if how == "open":
        kiln.open(path)
    elif how == "load":
        kiln.load(path, "u8")
    elif how == "load_tensors":
        kiln.load_tensors(path)
    else:
        kiln.load_tensors(path, copy=True)
except OSError as e:
    print(type(e).__name__, e)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("how", ["open", "load", "load_tensors", "copy"])
def test_the_api_refuses_a_fifo_without_blocking(tmp_path, how):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-c", _FIFO_CHILD, str(fifo), how], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NotAFile") and "a FIFO, not a regular file" in r.stdout, r.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("cmd", ["inspect", "check"])
def test_the_command_refuses_a_fifo_without_blocking(tmp_path, cmd):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "kiln", cmd, str(fifo)], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "a FIFO, not a regular file" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_character_device_is_refused(api):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(OSError, match="a character device, not a regular file"):
        kiln.open("/dev/zero")
    with pytest.raises(IsADirectoryError):
        kiln.open(ROOT)
