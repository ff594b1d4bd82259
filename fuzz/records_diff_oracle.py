"""The oracle and mutations of fuzz/records_diff.py, a bounded differential
fuzz of the record container between the kernels, without atheris or a
sanitizer build (``python fuzz/records_diff.py TARGET SECONDS [SEED]``,
TARGET ``file`` or ``stream``; ``tests/test_records_fuzz.py`` runs a few
hundred inputs of each).

Inputs are mutations of the seed corpus (``fuzz/corpus/records``, byte 0
picking the type and options as in ``records_oracle.py``): blind ones (bit
flips, byte sets, cuts, insertions) and structural ones, which change a
record's length, pad, kind or value, an index entry or the trailer and then
make every CRC right again, so that the checks behind the checksums are
reached.

``file``: ``kiln.RecordFile`` over the bytes, iterated, indexed one record at
a time and sliced, on the pure and the compiled kernels: the same records or
the same error code and offset.  ``stream``: ``kiln.StreamDecoder`` fed in
random chunkings, on both kernels: the same records, error, ``count`` and
``done`` whatever the chunking, ``count`` equal to the records handed out.
Only ``kiln.KilnError`` may escape.  Each new kind of failure is printed and
its input saved as /tmp/kiln-fuzz-records-TARGET-N.
"""

import io
import os
import random
import struct
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kiln  # noqa: E402
import records_oracle as O  # noqa: E402

CORPUS = os.path.join(HERE, "corpus", "records")


def _err(e):
    if not isinstance(e, kiln.KilnError):
        raise AssertionError("%s escaped: %r" % (type(e).__name__, e))
    assert e.offset >= 0, e
    return ("error", e.code, e.offset)


def read_file(body, t, k, recover, verify):
    """Iteration, every rf[i] and one slice of a RecordFile over ``body``."""
    out = []
    try:
        rf = kiln.RecordFile(io.BytesIO(body), t, recover=recover, verify=verify, kernels=k)
    except Exception as e:   # noqa: BLE001 - the oracle sorts them
        return [_err(e)]
    with rf:
        n = len(rf)
        out.append(("len", n, None if rf.recovery is None else
                    (rf.recovery.offset, _err(rf.recovery.error))))
        for how in ("iter", "items", "slice"):
            got = []
            try:
                if how == "iter":
                    for v in rf:
                        got.append(O.summary(v))
                elif how == "items":
                    for i in range(n):
                        got.append(O.summary(rf[i]))
                else:
                    got = [O.summary(v) for v in rf[1:n]]
                out.append((how, got))
            except Exception as e:   # noqa: BLE001
                out.append((how, got, _err(e)))
    return out


def read_stream(body, t, k, verify, cap, cuts):
    d = kiln.StreamDecoder(t, verify=verify, max_record_bytes=cap, kernels=k)
    out = []
    err = None
    try:
        for a, b in zip([0] + cuts, cuts + [len(body)]):
            out += [O.summary(v) for v in d.feed(body[a:b])]
        d.eof()
    except Exception as e:   # noqa: BLE001
        err = _err(e)
    assert d.count == len(out), ("count", d.count, len(out), err)
    return (out, err, d.count, d.done)


def check(target, data, rng):
    if not data:
        return
    t = O.TYPES[data[0] & 3]
    recover, verify = bool(data[0] & 4), not data[0] & 8
    cap = 64 if data[0] & 16 else 1 << 20
    body = bytes(data[1:])
    if target == "file":
        got = [read_file(body, t, k, recover, verify) for k in O.KERNELS]
        assert all(g == got[0] for g in got), got
        return
    chunkings = [[], sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 3)))
                 if len(body) > 1 else []]
    step = rng.randint(1, 9)
    chunkings.append(list(range(step, len(body), step)))
    got = [read_stream(body, t, k, verify, cap, c) for k in O.KERNELS for c in chunkings]
    assert all(g == got[0] for g in got), got


# --- mutations -------------------------------------------------------------------

def _records(body):
    """The (offset, length, pad, kind) of each head a walk from byte 16 finds."""
    out, pos = [], 16
    while pos + 16 <= len(body) and len(out) < 64:
        length, kind, pad = struct.unpack_from("<QBB", body, pos)
        out.append((pos, length, pad, kind))
        end = pos + 20 + pad + length
        if end > len(body) or end <= pos:
            break
        pos = end
    return out


def _fix(body, recs):
    """Every head CRC and record CRC of ``recs`` made right (where the record
    lies in ``body``), then the trailer's."""
    for pos, _, _, _ in recs:
        if pos + 16 > len(body):
            continue
        body[pos + 12:pos + 16] = struct.pack("<I", zlib.crc32(bytes(body[pos:pos + 12])))
        length, _, pad = struct.unpack_from("<QBB", body, pos)
        end = pos + 16 + pad + length
        if end + 4 <= len(body):
            body[end:end + 4] = struct.pack("<I", zlib.crc32(bytes(body[pos:end])))
    if len(body) >= 56 and body[-8:] == b"KLNR_END":
        body[-12:-8] = struct.pack("<I", zlib.crc32(bytes(body[-40:-12])))


def _structural(rng, data):
    d = bytearray(data)
    body = d[1:]
    recs = _records(body)
    if not recs:
        return bytes(d)
    pos, length, pad, kind = rng.choice(recs)
    op = rng.randrange(8)
    if op == 0:        # the value length
        new = rng.choice([0, 15, 16, length - 1, length + 1, length + rng.randint(-8, 8),
                          len(body), (1 << 64) - 1, 1 << 63])
        body[pos:pos + 8] = struct.pack("<Q", max(0, new) % (1 << 64))
    elif op == 1:      # the pad, with or without the bytes it claims
        new = rng.choice([0, 1, 7, 8, 63, 64, pad + 1, max(pad - 1, 0)])
        new %= 256
        body[pos + 9] = new
        if rng.random() < 0.5 and new > pad:
            body[pos + 16:pos + 16] = bytes(new - pad)
    elif op == 2:      # the kind
        body[pos + 8] = rng.choice([0, 1, 2])
    elif op == 3 and length:   # a byte of the value
        at = pos + 16 + pad + rng.randrange(max(1, min(length, len(body) - pos - 16 - pad)))
        if at < len(body):
            body[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, body[at] ^ 1])
    elif op == 4 and len(body) >= 40:   # an index entry or a trailer field
        tail = len(body) - 40
        field = rng.choice([tail, tail + 8, rng.randrange(max(1, tail))])
        if field + 8 <= len(body):
            body[field:field + 8] = struct.pack("<Q", rng.choice(
                [0, 16, 36, 56, rng.randrange(1 << 16), (1 << 64) - 1,
                 struct.unpack_from("<Q", body, field)[0] + rng.randint(-40, 40)]) % (1 << 64))
    elif op == 5:      # a record repeated or dropped
        rec = bytes(body[pos:pos + 20 + pad + length])
        if rng.random() < 0.5:
            body[pos:pos] = rec
        else:
            del body[pos:pos + len(rec)]
    elif op == 6:      # the value cut or grown by a few bytes (its length follows)
        v = pos + 16 + pad
        if v + length <= len(body):
            k = rng.randint(1, 8)
            if rng.random() < 0.5 and length > k:
                del body[v + length - k:v + length]
                body[pos:pos + 8] = struct.pack("<Q", length - k)
            else:
                body[v + length:v + length] = bytes(rng.randrange(256) for _ in range(k))
                body[pos:pos + 8] = struct.pack("<Q", length + k)
    else:              # the bytes cut anywhere
        del body[rng.randrange(len(body)):]
    _fix(body, _records(body))
    if rng.random() < 0.4:
        body = _rebuild(body)
    return bytes(d[:1] + body)


_LIST_U64 = None


def _rebuild(body):
    """The records a walk finds before the index, with a new index and
    trailer that agree with them (and right CRCs): the value decoders and
    the record checks behind the index are reached with a changed record."""
    global _LIST_U64
    if _LIST_U64 is None:
        _LIST_U64 = kiln.parse_type("list<u64>").schema_hash
    if len(body) < 16:
        return body
    out = bytearray(body[:16])
    offs = []
    for pos, length, pad, kind in _records(body):
        end = pos + 20 + pad + length
        if kind == 1 or end > len(body):
            break
        offs.append(len(out))
        out += body[pos:end]
    ip = len(out)
    value = struct.pack("<4sBBHQI", b"KLN0", 0, 0, 0, _LIST_U64, len(offs)) + \
        b"".join(struct.pack("<Q", o) for o in offs)
    pad = -(ip + 16 + 20) % 8
    first = struct.pack("<QBBH", len(value), 1, pad, 0)
    rec = first + struct.pack("<I", zlib.crc32(first)) + bytes(pad) + value
    out += rec + struct.pack("<I", zlib.crc32(rec))
    h = struct.unpack_from("<Q", body, 8)[0]
    first = struct.pack("<QQQBBH", ip, len(offs), h, 1, 0, 0)
    out += first + struct.pack("<I", zlib.crc32(first)) + b"KLNR_END"
    return out


def _blind(rng, data):
    d = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op, at = rng.random(), rng.randrange(1, max(len(d), 2))
        if op < 0.4 and at < len(d):
            d[at] ^= 1 << rng.randrange(8)
        elif op < 0.6 and at < len(d):
            d[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF])
        elif op < 0.8:
            del d[at:at + rng.randint(1, 32)]
        else:
            d[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(d)


def mutate(rng, data):
    out = _structural(rng, data) if rng.random() < 0.7 else _blind(rng, data)
    if rng.random() < 0.5:
        out = _structural(rng, out)
    if out and rng.random() < 0.2:
        out = bytes([rng.randrange(32)]) + out[1:]
    return out


def seeds():
    out = []
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), "rb") as f:
            out.append(f.read())
    return out


def run(target, seconds=None, cases=None, seed=1, report=print):
    """Fuzz ``target`` for ``seconds`` or ``cases`` inputs; returns
    ``(runs, findings)``, each finding ``(kind, message, input)``."""
    rng = random.Random(seed)
    pool = seeds()
    start, runs, findings, seen = time.time(), 0, [], set()
    while (cases is None or runs < cases) and \
            (seconds is None or time.time() - start < seconds):
        data = mutate(rng, rng.choice(pool))
        runs += 1
        try:
            check(target, data, rng)
        except Exception as e:   # noqa: BLE001 - anything but the oracle's pass is a finding
            key = (type(e).__name__, str(e)[:80])
            if key not in seen:
                seen.add(key)
                findings.append((key[0], str(e)[:2000], data))
                if report is not None:
                    path = "/tmp/kiln-fuzz-records-%s-%d" % (target, len(seen))
                    with open(path, "wb") as f:
                        f.write(data)
                    report("%s: %s: %s (%s)" % (target, key[0], str(e)[:300], path))
        if len(pool) < 4096 and rng.random() < 0.05:
            pool.append(data)    # mutations of mutations reach deeper
    return runs, findings

