"""Mutation fuzzing of tensor files with wide name fields (spec/kiln-v2.md 12.3)
without atheris or a sanitizer build.

    python tools/fuzz_wide.py SECONDS [SEED]     mutate the seeds, run the oracle
    python tools/fuzz_wide.py --seeds            (re)write the seeds into fuzz/corpus/directory

Each input is a tensor file (``fuzz/oracle.py`` ``check_tensor_file``): both
kernels (``validate_directory`` and ``validate_directory_copy`` with
``wide=True``) and the reference decoder (``kiln_ref.read_tensor_file``) give
the same code and offset or the same tensors, and an accepted file is what
the writers' ``block_head`` makes of its rows.  Besides blind bit flips and
cuts, the mutations aim at the parts the wide layout adds: the flags byte,
the eight bytes d+4..d+11, the four u32 fields at d+112..d+127 (set to the
cursor, near it, 0xFFFF, 0xFFFFFFFF, past the heap) and the heap's length.
Each new kind of failure is printed and its input saved as
/tmp/kiln-fuzz-wide-N; add a minimized one to fuzz/corpus/directory under a
``finding-`` name (byte 0 = 8: read as a tensor file).
"""

import os
import random
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402
from kiln import _wire as W  # noqa: E402
from kiln._dirhead import block_head  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus", "directory")
TENSOR_FILE = b"\x08"   # check_directory_input's byte 0: a tensor file


def _meta(name, code=2, shape=(1,), layout=None, block=0, nbytes=None):
    n = 1
    for d in shape:
        n *= d
    return (code, shape, name, layout, block, 0, W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX,
            n * 4 if nbytes is None else nbytes)


def _file(metas, fill=1):
    head, places, total = block_head(metas, 0, True)
    out = bytearray(head) + bytearray(total)
    for p, m in zip(places, metas):
        out[len(head) + p:len(head) + p + m[-1]] = bytes([fill]) * m[-1]
    return bytes(out)


def _narrow_as_wide(buf, count):
    """A narrow file with the wide flag and its u16 fields moved to d+112."""
    out = bytearray(buf)
    out[W.H_FLAGS] |= W.FLAG_WIDE
    for i in range(count):
        d = W.HEADER_SIZE + W.DESC_SIZE * i
        no, nl, lo, ll = struct.unpack_from("<HHHH", buf, d + 4)
        struct.pack_into("<HHHH", out, d + 4, 0, 0, 0, 0)
        struct.pack_into("<IIII", out, d + 112, W.U32_MAX if no == W.NO_NAME else no, nl,
                         W.U32_MAX if lo == W.NO_NAME else lo, ll)
    return bytes(out)


def seeds():
    """name -> corpus bytes (byte 0 included)."""
    wide2 = _file([_meta(b"a" * 65536), _meta(b"b")])
    unnamed = _file([_meta(None, 4096, (8,), b"q" * 65600, 32, 32), _meta(None, 7, (3,), nbytes=3)], 0)
    small = _file([_meta(b"w"), _meta(b"x", 7, (2,), nbytes=2)], 0)
    fits = _narrow_as_wide(small, 2)
    past = bytearray(fits)   # the wide fields, the first name's offset far past the heap
    struct.pack_into("<I", past, W.HEADER_SIZE + W.D_WNAME_OFF, 70000)
    narrow_left = bytearray(fits)
    narrow_left[W.HEADER_SIZE + 4] = 1
    none16 = bytearray(fits)
    struct.pack_into("<I", none16, W.HEADER_SIZE + W.D_WLAYOUT_OFF, W.NO_NAME)
    return {
        "wide-two-names": TENSOR_FILE + wide2,
        "wide-unnamed-long-layout": TENSOR_FILE + unnamed,
        "wide-trusted-small-caps": b"\x0e" + wide2,
        "wide-refused-flag-on-fitting-names": TENSOR_FILE + fits,
        "wide-refused-offset-past-the-heap": TENSOR_FILE + bytes(past),
        "wide-refused-nonzero-narrow-field": TENSOR_FILE + bytes(narrow_left),
        "wide-refused-0xffff-as-none": TENSOR_FILE + bytes(none16),
        "wide-refused-in-a-tensors-value": b"\x00" + wide2,
    }


INTERESTING = [0, 1, 0xFFFF, 0x10000, 0x10001, W.U32_MAX, W.U32_MAX - 1, 65535 * 2, 1 << 31]


def mutate(rng, data):
    d = bytearray(data)
    body = 1   # byte 0 picks the options
    count = struct.unpack_from("<I", d, body + W.H_COUNT)[0] if len(d) >= body + 64 else 0
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.15 and len(d) > body + W.H_FLAGS:
            d[body + W.H_FLAGS] ^= 1 << rng.randrange(3)
        elif op < 0.55 and count and len(d) >= body + 64 + 128 * min(count, 4):
            i = rng.randrange(min(count, 4))
            at = body + W.HEADER_SIZE + W.DESC_SIZE * i
            if rng.random() < 0.7:
                f = at + 112 + 4 * rng.randrange(4)
                old = struct.unpack_from("<I", d, f)[0]
                v = rng.choice(INTERESTING + [old + rng.randint(-3, 3)]) & W.U32_MAX
                struct.pack_into("<I", d, f, v)
            else:
                d[at + 4 + rng.randrange(8)] = rng.choice([0, 1, 0xFF])
        elif op < 0.65 and len(d) >= body + 16:
            v = struct.unpack_from("<I", d, body + W.H_NAME_BYTES)[0] + rng.randint(-2, 2)
            struct.pack_into("<I", d, body + W.H_NAME_BYTES, v & W.U32_MAX)
        elif op < 0.85 and len(d) > 1:
            at = rng.randrange(1, len(d))
            d[at] ^= 1 << rng.randrange(8)
        elif len(d) > 2:
            at = rng.randrange(1, len(d))
            del d[at:at + rng.randint(1, 64)]
    return bytes(d)


def main():
    if sys.argv[1:] == ["--seeds"]:
        for name, data in seeds().items():
            with open(os.path.join(CORPUS, name), "wb") as f:
                f.write(data)
        return 0
    secs = float(sys.argv[1])
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    pool = list(seeds().values())
    runs, kinds, found = 0, {}, set()
    end = time.monotonic() + secs
    while time.monotonic() < end:
        data = mutate(rng, rng.choice(pool))
        try:
            oracle.check_directory_input(data)
            kinds["ok"] = kinds.get("ok", 0) + 1
        except AssertionError as e:
            key = str(e)[:80]
            if key not in found:
                found.add(key)
                path = "/tmp/kiln-fuzz-wide-%d" % len(found)
                with open(path, "wb") as f:
                    f.write(data)
                print("FINDING %s: %s" % (path, e))
        except Exception as e:   # anything but KilnError escaping is a finding too
            key = type(e).__name__
            if key not in found:
                found.add(key)
                path = "/tmp/kiln-fuzz-wide-%d" % len(found)
                with open(path, "wb") as f:
                    f.write(data)
                print("FINDING %s: %r" % (path, e))
        runs += 1
    print("%d inputs, %d findings" % (runs, len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
