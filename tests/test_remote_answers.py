"""Every remote answer is checked against its question (issue 27.1-27.6).

The suite's own loopback server (tests/_servers.py) answers the ways real
servers get range requests wrong: it ignores them, names another range,
another total, compresses, sends a short or a long body, resets the
connection.  Each is a :class:`kiln.remote.RemoteError` (an ``OSError``),
at the open or at the read it hits, never another tensor's bytes, never
more read than was asked for.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _wire as W
from kiln.remote import RemoteError, RemoteFileChanged

from _servers import RangeServer
from _util import ROOT

MiB = 1 << 20


def _two(root):
    """a and b, 64 bytes each, far enough in to need requests of their own."""
    t = {"pad": np.zeros(80 << 10, np.uint8), "a": np.arange(16, dtype=np.float32),
         "b": np.full(16, 7, np.float32)}
    kiln.save_tensors(root / "two.kiln", t)
    return t


BAD = {  # behaviour: what the error says
    "ignore-range": "ignored the range request",
    "shift": "not the range asked for",
    "bad-length": "Content-Length",
    "gzip": "gzip-encoded",
    "short": "ended after",
    "reset": "transport fault|ended after",     # ECONNRESET, or the end of the stream
    "chunked-long": "longer than",
}


@pytest.mark.parametrize("behave", sorted(BAD))
@pytest.mark.parametrize("when", ["open", "read"])
def test_each_wrong_answer_is_a_remote_error(api, tmp_path, behave, when):
    t = _two(tmp_path)
    with RangeServer(tmp_path, behave, start_at=0 if when == "open" else 1) as server:
        url = server.url + "two.kiln"
        if when == "open":
            with pytest.raises(RemoteError, match=BAD[behave]):
                kiln.open(url)
        else:
            with kiln.open(url) as f:
                with pytest.raises(RemoteError, match=BAD[behave]):
                    f["a"]
                with pytest.raises(RemoteError):      # and again: nothing was kept
                    f["a"]
            server.behave = "ranges"
            with kiln.open(url) as f:
                assert f["a"].numpy().tolist() == t["a"].tolist()
        assert all(enc == "identity" for _, enc in server.requests)


def test_another_range_never_reads_as_the_tensor_asked_for(api, tmp_path):
    t = _two(tmp_path)
    with RangeServer(tmp_path, "shift", shift=64, start_at=1) as server:
        with kiln.open(server.url + "two.kiln") as f:
            d = kiln.decode_tensors((tmp_path / "two.kiln").read_bytes())
            i = d.keys().index("a")
            assert d._rows[i + 1][10] - d._rows[i][10] == 64    # b's bytes, 64 further on
            with pytest.raises(RemoteError, match="answered bytes %d-" % (d._pb + d._rows[i][10]
                                                                          + 64)):
                f["a"]
            assert t["b"].tolist() != t["a"].tolist()


def test_a_changed_total_is_a_changed_file(api, tmp_path):
    _two(tmp_path)
    with RangeServer(tmp_path, "bad-total", start_at=1) as server:
        with kiln.open(server.url + "two.kiln") as f:
            with pytest.raises(RemoteFileChanged, match="changed after it was opened"):
                f["a"]
    with RangeServer(tmp_path, "bad-total") as server:    # one byte more from the start
        with pytest.raises(kiln.KilnError) as e:
            kiln.open(server.url + "two.kiln")
        assert e.value.code == "TRAILING"


def test_a_row_source_checks_its_answers_too(api, tmp_path):
    _two(tmp_path)
    with RangeServer(tmp_path) as server:
        with kiln.open(server.url + "two.kiln") as f:
            rs = f.row_source("a")
        assert np.frombuffer(rs.read(2, 4), np.float32).tolist() == [2.0, 3.0]
        for behave in ("shift", "gzip", "short", "bad-total"):
            server.behave = behave
            with pytest.raises(RemoteError):
                rs.read(0, 4)


def test_a_small_file_from_a_server_without_ranges(api, tmp_path):
    kiln.save_tensors(tmp_path / "s.kiln", {"x": np.arange(5, dtype=np.int8),
                                            "f": np.array([True, False])}, metadata={"k": 1})
    with RangeServer(tmp_path, "ignore-range") as server:
        with kiln.open(server.url + "s.kiln") as f:     # the whole file fits the first ask
            assert f["x"].numpy().tolist() == [0, 1, 2, 3, 4]
            assert f["f"].numpy().tolist() == [True, False] and f.metadata == {"k": 1}
        assert len(server.requests) == 1


def test_the_header_is_checked_before_the_table_is_asked_for(api, tmp_path):
    data = bytearray(kiln.encode_tensors({"a": np.ones(4, np.float32)}))
    data += bytes(200 << 10)                           # room past the first request
    for name, version, count in (("v3.kiln", 3, 8_000_000), ("big.kiln", 2, 8_000_000),
                                 ("cap.kiln", 2, W.DEFAULT_MAX_COUNT + 1)):
        bad = bytearray(data)
        bad[4] = version
        bad[8:12] = count.to_bytes(4, "little")
        heap = int.from_bytes(bad[12:16], "little")
        bad[24:32] = (count * W.DESC_SIZE + heap).to_bytes(8, "little")   # consistent
        (tmp_path / name).write_bytes(bytes(bad))
        with pytest.raises(kiln.KilnError) as local:
            kiln.open(tmp_path / name)
        with RangeServer(tmp_path) as server:
            with pytest.raises(kiln.KilnError) as remote:
                kiln.open(server.url + name)
            assert len(server.requests) == 1, server.requests      # the first 64 KiB only
            assert server.sent < (70 << 10)
        assert (remote.value.code, remote.value.offset) == (local.value.code, local.value.offset)
        assert (local.value.code, local.value.offset) == {
            "v3.kiln": ("FRAME", 4), "big.kiln": ("EOF", 8), "cap.kiln": ("LIMIT", 8)}[name]


def test_kiln_check_of_a_short_body_is_one_line(tmp_path):
    _two(tmp_path)
    with RangeServer(tmp_path, "short", start_at=4) as server:
        r = subprocess.run([sys.executable, "-m", "kiln", "check", server.url + "two.kiln"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ended after" in r.stderr


_RSS_CHILD = r"""
import json, resource, sys
import kiln
try:
    kiln.open(sys.argv[1]).close()
    what = "opened"
except OSError as e:
    what = type(e).__name__
print(json.dumps({"what": what, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  * 1024}))
"""


def test_a_server_ignoring_ranges_costs_what_was_asked(tmp_path):
    """256 MiB sent as a 200 for a 64 KiB question: the client reads none of it
    (peak RSS and bytes the server got out, compared with a plain open)."""
    with kiln.TensorWriter(tmp_path / "huge.kiln") as w:
        w.add("h", "u8", (256 * MiB,))
        w.write("h", None)
    kiln.save_tensors(tmp_path / "tiny.kiln", {"t": np.ones(2, np.float32)})
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = {}
    with RangeServer(tmp_path) as server:
        for name, behave in (("tiny", "ranges"), ("huge", "ignore-range")):
            server.behave = behave
            with server.lock:
                server.sent = 0
            r = subprocess.run([sys.executable, "-c", _RSS_CHILD, server.url + name + ".kiln"],
                               capture_output=True, text=True, timeout=120, env=env)
            assert r.returncode == 0, r.stderr
            out[name] = dict(json.loads(r.stdout), sent=server.sent)
    print("ignored range: peak RSS %.1f MiB (plain open %.1f MiB), server got out %d bytes"
          % (out["huge"]["maxrss"] / MiB, out["tiny"]["maxrss"] / MiB, out["huge"]["sent"]))
    assert out["huge"]["what"] == "RemoteError" and out["tiny"]["what"] == "opened"
    assert out["huge"]["maxrss"] - out["tiny"]["maxrss"] < 16 * MiB, out
    assert out["huge"]["sent"] < 32 * MiB, out       # socket buffers, not the 256 MiB


def test_http_storage_options_are_headers_and_a_timeout(api, tmp_path):
    _two(tmp_path)
    with RangeServer(tmp_path) as server:
        url = server.url + "two.kiln"
        with kiln.open(url, storage_options={"headers": {"X-Kiln": "1"}, "timeout": 5}) as f:
            assert f["a"].numpy().tolist() == list(range(16))
        with pytest.raises(TypeError, match="'client_kwargs'"):
            kiln.open(url, storage_options={"client_kwargs": {}})
    with pytest.raises(RemoteError, match="transport fault"):
        kiln.open(server.url + "two.kiln")            # the server is gone: refused
