"""A tensor file writer needs no address space for the file it writes
(issue 51, item 5): ``TensorWriter`` and ``save_tensors`` check the file they
are about to commit by reading its head and the payload bytes that have rules
with ``pread``, never by mapping the file.  Each case runs in a child process
whose address space (RLIMIT_AS) is capped at what it already uses plus less
than the file's size: a writer that maps the file fails there with ENOMEM."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _wire as W

CHILD = r"""
import json, os, resource, sys
import numpy as np
import kiln

def vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024

path, size, room, case = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
chunk = np.full(16 << 20, 7, np.uint8)       # every buffer the child needs, made first
flags = np.array([True, False, True])
kiln.TensorWriter   # the lazy names resolved before the cap
limit = vm("VmSize:") + room
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
out = {"impl": kiln.IMPLEMENTATION}
try:
    with kiln.TensorWriter(path, metadata={"k": "v"}, checksum=True) as w:
        w.add("big", "u8", (size,))
        w.add("flags", "bool", (3,))
        w.write("flags", flags)
        if case == "declare":
            raise SystemExit(json.dumps(dict(out, started=True)))
        for at in range(0, size, len(chunk)):
            w.write_rows("big", at, chunk[:min(len(chunk), size - at)])
    out["ok"] = True
except MemoryError as e:
    out["error"] = "MemoryError %s" % e
except OSError as e:
    out["error"] = "OSError %s" % e
print(json.dumps(out))
"""


def _child(impl, tmp_path, size, room, case="whole"):
    env = dict(os.environ)
    env.pop("KILN_PUREPYTHON", None)
    if impl.name == "python":
        env["KILN_PUREPYTHON"] = "1"
    path = str(tmp_path / "big.kiln")
    r = subprocess.run([sys.executable, "-c", CHILD, path, str(size), str(room), case],
                       env=env, capture_output=True, text=True, timeout=120)
    text = r.stdout.strip() or r.stderr.strip()
    got = json.loads(text.splitlines()[-1])
    assert got["impl"] == impl.name
    return path, got


def test_a_writer_commits_a_file_larger_than_its_address_space_room(impl, tmp_path):
    size = 256 << 20   # the child may grow by 64 MiB: a mapping of the file cannot fit
    path, got = _child(impl, tmp_path, size, 64 << 20)
    assert got == {"impl": impl.name, "ok": True}
    assert os.path.getsize(path) >= size
    with kiln.open(path) as f:   # the file is whole (read back without the cap)
        assert f.metadata == {"k": "v"}
        assert f["flags"].numpy().tolist() == [True, False, True]
        big = f["big"].numpy()
        assert big.shape == (size,) and int(big[0]) == 7 and int(big[-1]) == 7
        f.verify()


def test_declaring_a_tensor_beyond_the_room_starts_the_file(impl, tmp_path):
    # the case scaled: the table is written and checked at the first write
    _, got = _child(impl, tmp_path, 4 << 30, 64 << 20, "declare")
    assert got == {"impl": impl.name, "started": True}


def _raw_file(payloads, code):
    """A file of one tensor a payload, written by hand (the oracle): dtype
    ``code``, each payload's bytes as given, zero gaps."""
    names = b"".join(b"t%d" % i for i in range(len(payloads)))
    descs, off = b"", 0
    for i, p in enumerate(payloads):
        descs += W.DESC.pack(code, 1, 0, 2 * i, 2, W.NO_NAME, 0, 0, 0, W.NO_AXIS, 0, W.NO_INDEX,
                             W.NO_INDEX, off, len(p), len(p), 0, 0, 0, 0, 0, 0, 0, bytes(16))
        off = W.dir_align(off + len(p))
    body = b"".join(p + bytes(W.dir_align(len(p)) - len(p)) for p in payloads[:-1]) + payloads[-1]
    head = W.HEADER.pack(W.DIR_MAGIC, 2, 3, 0, len(payloads), len(names), len(body),
                         len(descs) + len(names), bytes(32))
    table = head + descs + names
    return bytearray(table + bytes(W.dir_align(len(table)) - len(table)) + body)


def _checked(tmp_path, raw):
    """The writer's last check over ``raw`` as the file it is about to commit."""
    from kiln._files.atomic import AtomicFile
    from kiln._files.declare import _check_file
    with AtomicFile(tmp_path / "c.kiln") as out:
        out.pwrite(bytes(raw), 0)
        _check_file(out)


def _bad(payloads, code, pos, byte):
    """The file of ``payloads`` with byte ``pos`` of its payload block set to
    ``byte``; and the block's file offset."""
    raw = _raw_file(payloads, code)
    base = W.dir_align(W.HEADER_SIZE + (W.DESC_SIZE + 2) * len(payloads))
    raw[base + pos] = byte
    return raw, base


@pytest.mark.parametrize("payloads, code, pos", [
    ([b"\x01\x00\x01"], W.DTYPE_BOOL, 1),
    ([bytes(3 << 20)], W.DTYPE_BOOL, (3 << 20) - 2),   # in the third 1 MiB chunk
    ([b"\x01" * 5, b"\x00"], W.DTYPE_BOOL, 40),         # the gap after a bool payload
    ([b"abc", b"d"], 9, 3),                             # the gap after a u8 payload
    ([b"abc"] * 9, 9, 6 * 64 + 10),                     # one read of nine gaps: the seventh
    ([b"\x01" * 5] * 9, W.DTYPE_BOOL, 8 * 64 + 2),       # ... and of nine bools: the last
], ids=["bool", "bool-third-chunk", "bool-gap", "u8-gap", "u8-gap-7-of-9", "bool-9-of-9"])
def test_the_last_check_reads_payload_bytes_and_gaps_as_a_reader(api, tmp_path, payloads, code,
                                                                   pos):
    raw, base = _bad(payloads, code, pos, 2)
    with pytest.raises(kiln.KilnError) as ref:   # the reader's verdict on those bytes
        kiln.decode_tensors(bytes(raw))
    assert (ref.value.code, ref.value.offset) == ("TYPE", base + pos)
    with pytest.raises(kiln.EncodeError) as e:
        _checked(tmp_path, raw)
    assert (e.value.code, e.value.offset) == (ref.value.code, ref.value.offset)
    assert not (tmp_path / "c.kiln").exists()


def test_the_last_check_passes_what_a_reader_takes(api, tmp_path):
    raw = _raw_file([b"\x01\x00\x01", b"\x00" * 100, b"\x01"], W.DTYPE_BOOL)
    assert [t.numpy().tolist() for t in kiln.decode_tensors(bytes(raw)).values()][0] == \
        [True, False, True]
    _checked(tmp_path, raw)
    assert (tmp_path / "c.kiln").read_bytes() == bytes(raw)


def test_a_truncated_file_is_refused_at_its_end(api, tmp_path):
    raw = _raw_file([b"\x01" * 100], W.DTYPE_BOOL)
    with pytest.raises(kiln.KilnError) as ref:
        kiln.decode_tensors(bytes(raw[:-10]))
    with pytest.raises(kiln.EncodeError) as e:
        _checked(tmp_path, raw[:-10])
    assert (e.value.code, e.value.offset) == (ref.value.code, ref.value.offset)


def test_a_head_only_check_gives_what_the_whole_buffer_gives(impl):
    raw = bytes(_raw_file([b"\x01\x00", b"\x00" * 70, b"\x01"], W.DTYPE_BOOL))
    base = W.dir_align(W.HEADER_SIZE + (W.DESC_SIZE + 2) * 3)
    k = impl.kernels
    whole = k.validate_directory_copy(raw, 0, True, False, 100, 1 << 20)
    assert whole[:2] == (len(raw), base)
    for cut in (base, base + 1, len(raw)):
        assert k.validate_directory_copy(raw[:cut], 0, True, False, 100, 1 << 20,
                                         len(raw)) == whole
    # the bounds are the length's: a longer buffer has trailing bytes, a shorter is EOF
    with pytest.raises(kiln.KilnError) as e:
        k.validate_directory_copy(raw[:base], 0, True, False, 100, 1 << 20, len(raw) + 1)
    assert (e.value.code, e.value.offset) == ("TRAILING", len(raw))
    with pytest.raises(kiln.KilnError) as e:
        k.validate_directory_copy(raw[:base], 0, True, False, 100, 1 << 20, len(raw) - 1)
    assert (e.value.code, e.value.offset) == ("EOF", W.H_PAYLOAD_BYTES)
    # a head that stops before the payload base is EOF, never a read past it
    for cut in (10, W.HEADER_SIZE, base - 1):
        with pytest.raises(kiln.KilnError) as e:
            k.validate_directory_copy(raw[:cut], 0, True, False, 100, 1 << 20, len(raw))
        assert e.value.code == "EOF"
    with pytest.raises(ValueError):
        k.validate_directory_copy(raw, 0, True, False, 100, 1 << 20, len(raw) - 1)
