"""The ratio workloads: each op has a floor, the kiln rows, variants and peers.

Every builder prepares all inputs (objects, encoded buffers, files) before
returning; the contenders' callables do only the work being measured.
"""

import dataclasses
import itertools
import json
import os
import pickle
import random
import string
import tempfile
import typing

import msgpack
import msgspec
import numpy as np
import safetensors.numpy as stnp

import kiln
from benchmarks.harness import (FLOOR, PEER, Contender, Op, Workload, kiln_contenders,
                                kiln_variant, workload)


def floor(what, fn):
    return Contender("floor: " + what, FLOOR, fn)


def peer(name, fn, gc=True):
    return Contender(name, PEER, fn, gc=gc)


def pickle5(obj):
    return pickle.dumps(obj, protocol=5)


def encoding(t, value):
    """``make(kernels)`` for ``kiln.Encoder(t).encode(value)``."""
    def make(K):
        e = kiln.Encoder(t, kernels=K).encode
        return lambda: e(value)
    return make


def decoding(t, buf, post=None, **options):
    """``make(kernels)`` for ``kiln.Decoder(t, **options).decode(buf)``, then ``post``."""
    def make(K):
        d = kiln.Decoder(t, kernels=K, **options).decode
        return (lambda: d(buf)) if post is None else (lambda: post(d(buf)))
    return make


MiB = 1 << 20


# --- 1. records -------------------------------------------------------------------

@dataclasses.dataclass
class Rec:
    id: int                         # i64
    name: str
    score: float                    # f64
    tags: kiln.list_(kiln.i32)      # decodes to a numpy int32 array


@dataclasses.dataclass
class RecL:
    """Rec with tags declared list[kiln.i32]: decodes to a Python list of ints, like msgspec."""
    id: int
    name: str
    score: float
    tags: list[kiln.i32]


@dataclasses.dataclass(slots=True)
class RecS:
    """Rec as a slots dataclass (fixed fields, no instance dict, like a msgspec Struct)."""
    id: int
    name: str
    score: float
    tags: kiln.list_(kiln.i32)


@dataclasses.dataclass(slots=True)
class RecLS:
    """RecL as a slots dataclass."""
    id: int
    name: str
    score: float
    tags: list[kiln.i32]


@dataclasses.dataclass
class Tags3:
    a: kiln.i32
    b: kiln.i32
    c: kiln.i32


@dataclasses.dataclass
class RecT:
    """Rec with the three tags as a struct of three i32 fields instead of list<i32>."""
    id: int
    name: str
    score: float
    tags: Tags3


class MRec(msgspec.Struct, array_like=True):
    id: int
    name: str
    score: float
    tags: list[int]


class RecNT(typing.NamedTuple):
    """Rec as a NamedTuple (same type, same bytes)."""
    id: int
    name: str
    score: float
    tags: kiln.list_(kiln.i32)


@dataclasses.dataclass
class MRecD:
    """msgspec's own dataclass binding (a map per record)."""
    id: int
    name: str
    score: float
    tags: list[int]


class MRecNT(typing.NamedTuple):
    """msgspec's own NamedTuple binding (an array per record)."""
    id: int
    name: str
    score: float
    tags: list[int]


REC_DICT = kiln.parse_type("list<struct{id:i64,name:str,score:f64,tags:list<i32>,}>")


def record_fields(n):
    rng = random.Random(5)
    alnum = string.ascii_letters + string.digits
    return [(rng.randrange(1 << 53), "".join(rng.choices(alnum, k=10)), rng.uniform(-1e3, 1e3),
             [rng.randrange(-(1 << 31), 1 << 31) for _ in range(3)]) for _ in range(n)]


@workload("records", quick=(10_000,), full=(100_000,))
def records(n, impls):
    """Records {id: i64, name: str (10 chars), score: f64, tags: 3 x i32} as a list of structs."""
    fields = record_fields(n)
    kiln_recs = [Rec(i, nm, s, np.array(t, np.int32)) for i, nm, s, t in fields]
    parsed = [(r.id, r.name, r.score, r.tags) for r in kiln_recs]
    struct_recs = [RecT(i, nm, s, Tags3(*t)) for i, nm, s, t in fields]
    list_kiln_recs = [RecL(i, nm, s, list(t)) for i, nm, s, t in fields]
    slots_recs = [RecS(r.id, r.name, r.score, r.tags) for r in kiln_recs]
    dict_recs = [dict(zip(("id", "name", "score", "tags"), p)) for p in parsed]
    m_recs = [MRec(i, nm, s, t) for i, nm, s, t in fields]
    list_recs = [[i, nm, s, t] for i, nm, s, t in fields]
    pickle_recs = [Rec(i, nm, s, t) for i, nm, s, t in fields]   # tags as a list of ints
    nt_recs = [RecNT(*p) for p in parsed]
    md_recs = [MRecD(i, nm, s, t) for i, nm, s, t in fields]
    mnt_recs = [MRecNT(i, nm, s, t) for i, nm, s, t in fields]
    m_dicts = [dict(zip(("id", "name", "score", "tags"), f)) for f in fields]

    T, TS, TL = kiln.list_(Rec), kiln.list_(RecT), kiln.list_(RecL)
    TR, TLS, TN = kiln.list_(RecS), kiln.list_(RecLS), kiln.list_(RecNT)
    kbuf, tbuf = kiln.Encoder(T).encode(kiln_recs), kiln.Encoder(TS).encode(struct_recs)
    assert kbuf == kiln.Encoder(REC_DICT).encode(dict_recs)   # same type, other binding
    assert kbuf == kiln.Encoder(TL).encode(list_kiln_recs)     # tags as a Python list
    assert kbuf == kiln.Encoder(TR).encode(slots_recs)         # a slots dataclass
    assert kbuf == kiln.Encoder(TN).encode(nt_recs)            # a NamedTuple

    menc, mdec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(list[MRec])
    mbuf, pbuf, mpbuf = menc.encode(m_recs), pickle5(pickle_recs), msgpack.packb(list_recs)
    md_dec = msgspec.msgpack.Decoder(list[MRecD]).decode
    mnt_dec = msgspec.msgpack.Decoder(list[MRecNT]).decode
    mdict_dec = msgspec.msgpack.Decoder(list[dict[str, typing.Any]]).decode
    mdbuf, mntbuf, mdictbuf = menc.encode(md_recs), menc.encode(mnt_recs), menc.encode(m_dicts)
    return Workload("records", "%s records" % f"{n:,}", [
        Op("encode", [
            floor("copy the output bytes", lambda: bytearray(kbuf)),
            *kiln_contenders(impls, encoding(T, kiln_recs)),
            kiln_variant(impls, "[tags=list]", encoding(TL, list_kiln_recs)),
            kiln_variant(impls, "[slots]", encoding(TR, slots_recs)),
            kiln_variant(impls, "[tags=struct]", encoding(TS, struct_recs)),
            kiln_variant(impls, "[dict]", encoding(REC_DICT, dict_recs)),
            kiln_variant(impls, "[namedtuple]", encoding(TN, nt_recs)),
            peer("msgspec", lambda: menc.encode(m_recs)),
            peer("msgspec [dataclass]", lambda: menc.encode(md_recs)),
            peer("msgspec [namedtuple]", lambda: menc.encode(mnt_recs)),
            peer("msgspec [dict]", lambda: menc.encode(m_dicts)),
            peer("msgpack", lambda: msgpack.packb(list_recs)),
            peer("pickle-5", lambda: pickle5(pickle_recs)),
        ]),
        Op("decode", [
            floor("build Rec objects", lambda: list(itertools.starmap(Rec, parsed))),
            *kiln_contenders(impls, decoding(T, kbuf)),
            kiln_variant(impls, "[gc off]", decoding(T, kbuf), gc=False),
            kiln_variant(impls, "[tags=list]", decoding(TL, kbuf)),
            kiln_variant(impls, "[tags=list, gc off]", decoding(TL, kbuf), gc=False),
            kiln_variant(impls, "[slots]", decoding(TR, kbuf)),
            kiln_variant(impls, "[slots, gc off]", decoding(TR, kbuf), gc=False),
            kiln_variant(impls, "[tags=list, slots]", decoding(TLS, kbuf)),
            kiln_variant(impls, "[tags=list, slots, gc off]", decoding(TLS, kbuf), gc=False),
            kiln_variant(impls, "[tags=struct]", decoding(TS, tbuf)),
            kiln_variant(impls, "[dict]", decoding(REC_DICT, kbuf)),
            kiln_variant(impls, "[namedtuple]", decoding(TN, kbuf)),
            peer("msgspec", lambda: mdec.decode(mbuf)),
            peer("msgspec [gc off]", lambda: mdec.decode(mbuf), gc=False),
            peer("msgspec [dataclass]", lambda: md_dec(mdbuf)),
            peer("msgspec [namedtuple]", lambda: mnt_dec(mntbuf)),
            peer("msgspec [dict]", lambda: mdict_dec(mdictbuf)),
            peer("msgpack", lambda: msgpack.unpackb(mpbuf)),
            peer("pickle-5", lambda: pickle.loads(pbuf)),
        ]),
    ], notes=[
        "kiln decodes tags (list<i32>) to a numpy int32 array per record; msgspec, "
        "msgpack and pickle give a list of 3 ints. [tags=struct] declares tags as a "
        "struct of three i32 fields bound to a dataclass (no count word: 42 bytes a "
        "record instead of 46).",
        "[tags=list] declares tags as list[kiln.i32], which decodes to a Python list of "
        "ints (as msgspec's list[int]); same bytes as Rec.",
        "[slots] binds the same type to @dataclass(slots=True) classes (RecS, RecLS): "
        "instances without a __dict__, as msgspec's Struct; same bytes as Rec.",
        "[dict] uses the type text instead of a dataclass; records decode to dicts.",
        "[namedtuple] binds the same type to a NamedTuple (RecNT); same bytes as Rec.",
        "msgspec [dataclass], [namedtuple] and [dict] are msgspec's own bindings of the "
        "record (tags list[int]; a dataclass and a dict are a msgpack map each, a "
        "NamedTuple an array); the unmarked msgspec row (an array_like Struct) is the "
        "fastest of them and the one every records target is judged against.",
        "Encode inputs are each codec's own decode output (kiln: Rec with an int32 "
        "array; msgspec: array_like Struct; msgpack: lists; pickle: Rec with a list).",
        "Floor (decode): Rec(*fields) for already-parsed fields; floor (encode): "
        "one copy of kiln's encoded bytes (writing the output at memory speed).",
    ])


# --- 2. floats ----------------------------------------------------------------------

@dataclasses.dataclass
class FRec:
    id: int
    values: kiln.list_(kiln.f64)


class MFRec(msgspec.Struct, array_like=True):
    id: int
    values: list[float]


@workload("floats", quick=(200_000,), full=(1_000_000,))
def floats(n, impls):
    """One record {id: i64, values: list<f64>} holding n values."""
    values = np.random.default_rng(2).standard_normal(n)
    rec = FRec(7, values)
    mrec = MFRec(7, values.tolist())
    kbuf = kiln.Encoder(FRec).encode(rec)
    menc, mdec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(MFRec)
    mbuf, pbuf = menc.encode(mrec), pickle5(rec)

    def encode_into(K):
        e, out = kiln.Encoder(FRec, kernels=K), bytearray()
        e.encode_into(rec, out)
        return lambda: e.encode_into(rec, out)

    return Workload("floats", "%s f64" % f"{n:,}", [
        Op("encode", [
            floor("ndarray.copy()", values.copy),
            *kiln_contenders(impls, encoding(FRec, rec)),
            kiln_variant(impls, "[encode_into]", encode_into),
            peer("msgspec", lambda: menc.encode(mrec)),
            peer("pickle-5", lambda: pickle5(rec)),
        ]),
        Op("decode", [
            floor("ndarray.copy()", values.copy),
            *kiln_contenders(impls, decoding(FRec, kbuf)),
            peer("msgspec", lambda: mdec.decode(mbuf)),
            peer("pickle-5", lambda: pickle.loads(pbuf)),
        ]),
    ], notes=[
        "kiln encodes the numpy array and decodes to an owned float64 array; msgspec "
        "encodes and decodes list[float] (a Python float per value); pickle-5 pickles "
        "the same dataclass holding the array (in-band).",
        "[encode_into] reuses one bytearray across calls instead of returning new bytes.",
    ])


# --- 3. many-tensors ----------------------------------------------------------------

def payload_offsets(buf, tensor_directory):
    """Byte offsets of each decoded (view) tensor's payload inside ``buf``."""
    base = np.frombuffer(buf, np.uint8).ctypes.data
    return [t.numpy().ctypes.data - base for t in tensor_directory.values()]


@workload("many-tensors", quick=(1_000,), full=(10_000,))
def many_tensors(n, impls):
    """A directory of n named f32[16] tensors."""
    rng = np.random.default_rng(3)
    arrays = {"t%05d" % i: rng.standard_normal(16).astype(np.float32) for i in range(n)}
    kbuf = kiln.Encoder(kiln.tensors).encode(arrays)
    sbuf = stnp.save(arrays)
    offsets = payload_offsets(kbuf, kiln.Decoder(kiln.tensors).decode(kbuf))
    f32 = np.float32

    def views():
        return [np.frombuffer(kbuf, f32, 16, o) for o in offsets]

    def st_load():
        return peer("safetensors.numpy.load", lambda: stnp.load(sbuf))

    def touch(directory):
        return [t.numpy() for t in directory.values()]

    return Workload("many-tensors", "%s x f32[16]" % f"{n:,}", [
        Op("encode", [
            floor("b''.join(payloads)", lambda: b"".join(arrays.values())),
            *kiln_contenders(impls, encoding(kiln.tensors, arrays)),
            peer("safetensors.numpy.save", lambda: stnp.save(arrays)),
        ]),
        Op("decode (views)", [
            floor("np.frombuffer x n", views),
            *kiln_contenders(impls, decoding(kiln.tensors, kbuf)),
            st_load(),
        ]),
        Op("decode + .numpy()", [
            floor("np.frombuffer x n", views),
            *kiln_contenders(impls, decoding(kiln.tensors, kbuf, touch)),
            kiln_variant(impls, "[copy=True]", decoding(kiln.tensors, kbuf, touch, copy=True)),
            st_load(),
        ]),
    ], notes=[
        "safetensors.numpy.load always copies every tensor; it is the peer of both "
        "kiln decode rows.",
        "Floor: one np.frombuffer per tensor at offsets known in advance (in kiln's "
        "own buffer).",
    ])


# --- 4. big-tensor ------------------------------------------------------------------

@workload("big-tensor", quick=(64 * MiB,), full=(64 * MiB, 256 * MiB))
def big_tensor(nbytes, impls):
    """One f32 tensor of nbytes; decode as a view and as an owned copy."""
    n = nbytes // 4
    arr = np.arange(n, dtype=np.float32)
    kbuf = kiln.Encoder(kiln.tensors).encode({"weight": arr})
    sbuf = stnp.save({"weight": arr})
    tmp = tempfile.TemporaryDirectory(prefix="kiln-bench-")
    st_path, np_path = os.path.join(tmp.name, "w.safetensors"), os.path.join(tmp.name, "w.npy")
    stnp.save_file({"weight": arr}, st_path)
    np.save(np_path, arr)
    (off,) = payload_offsets(kbuf, kiln.Decoder(kiln.tensors).decode(kbuf))
    view = np.frombuffer(kbuf, np.float32, n, off)
    del arr

    def first_array(directory):
        return directory[0].numpy()

    def st_peers():
        return [peer("safetensors (bytes)", lambda: stnp.load(sbuf)["weight"]),
                peer("safetensors (file)", lambda: stnp.load_file(st_path)["weight"])]

    return Workload("big-tensor", "%d MiB f32" % (nbytes // MiB), [
        Op("decode (view)", [
            floor("np.frombuffer", lambda: np.frombuffer(kbuf, np.float32, n, off)),
            *kiln_contenders(impls, decoding(kiln.tensors, kbuf, first_array)),
            *st_peers(),
            peer("np.load (mmap)", lambda: np.load(np_path, mmap_mode="r")),
        ]),
        Op("decode (copy)", [
            floor("ndarray.copy()", view.copy),
            *kiln_contenders(impls, decoding(kiln.tensors, kbuf, first_array, copy=True)),
            *st_peers(),
            peer("np.load", lambda: np.load(np_path)),
        ]),
    ], notes=[
        "kiln rows include .numpy() on the tensor, so every row ends with an ndarray. "
        "copy=True is not capped: the payload lies inside the checked buffer already.",
        "File peers read a temporary file from the page cache (written just before "
        "timing).",
    ], cleanup=tmp.cleanup)


# --- 5. sample ----------------------------------------------------------------------

@dataclasses.dataclass
class Sample:
    id: int
    text: str
    batch: kiln.TensorDirectory


class MTensor(msgspec.Struct, array_like=True):
    dtype: str
    shape: tuple[int, ...]
    data: memoryview


class MSample(msgspec.Struct, array_like=True):
    id: int
    text: str
    batch: dict[str, MTensor]


def sample_batches(pool):
    rng = np.random.default_rng(4)
    return [{
        "tokens": rng.integers(0, 50_000, 512, dtype=np.int32),
        "mask": (rng.random(512) < 0.9).astype(np.uint8),
        "emb": rng.standard_normal((512, 64)).astype(np.float16),
        "label": rng.integers(0, 10, 1, dtype=np.int64),
    } for _ in range(pool)]


def sample_text(i):
    return ("sample %d: the quick brown fox jumps over the lazy dog; " % i) * 3


def m_tensor(a):
    return MTensor(a.dtype.str, a.shape, memoryview(a).cast("B"))


def st_sample_decode(b):
    n = int.from_bytes(b[:8], "little")
    meta = json.loads(b[8:8 + n])["__metadata__"]
    return int(meta["id"]), meta["text"], stnp.load(b)


@workload("sample", quick=(500,), full=(10_000,))
def sample(n, impls):
    """n training samples {id: i64, text: str, batch: tensors} of four tensors each."""
    batches = sample_batches(16)   # the encoders' inputs reuse 16 array sets
    samples = [Sample(i, sample_text(i), batches[i % 16]) for i in range(n)]
    kbufs = [kiln.Encoder(Sample).encode(s) for s in samples]
    p_objs = [{"id": s.id, "text": s.text, "batch": s.batch} for s in samples]
    pbufs = [pickle5(o) for o in p_objs]
    m_objs = [MSample(s.id, s.text, {k: m_tensor(a) for k, a in s.batch.items()})
              for s in samples]
    menc, mdec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(MSample)
    mbufs = [menc.encode(o) for o in m_objs]
    st_in = [(s.batch, {"id": str(s.id), "text": s.text}) for s in samples]
    sbufs = [stnp.save(b, metadata=m) for b, m in st_in]
    # the floor's own layout: the four payloads back to back, then the text
    offs = list(itertools.accumulate([0] + [a.nbytes for a in batches[0].values()]))
    layout = [(a.dtype, a.size, a.shape, o) for a, o in zip(batches[0].values(), offs)]
    text_at = offs[-1]
    raw = [b"".join([*s.batch.values(), s.text.encode()]) for s in samples]

    def floor_decode():
        return [([np.frombuffer(b, dt, count, o).reshape(sh) for dt, count, sh, o in layout],
                 b[text_at:].decode()) for b in raw]

    def m_decode():
        out = []
        for b in mbufs:
            m = mdec.decode(b)
            out.append((m.id, m.text, {k: np.frombuffer(t.data, t.dtype).reshape(t.shape)
                                       for k, t in m.batch.items()}))
        return out

    def k_encode(K):
        e = kiln.Encoder(Sample, kernels=K).encode
        return lambda: [e(s) for s in samples]

    def k_decode(K):
        d = kiln.Decoder(Sample, kernels=K).decode
        return lambda: [(s.id, s.text, s.batch.to_dict()) for s in map(d, kbufs)]

    return Workload("sample", "%s samples" % f"{n:,}", [
        Op("encode", [
            floor("b''.join(payloads + text)",
                  lambda: [b"".join([*s.batch.values(), s.text.encode()]) for s in samples]),
            *kiln_contenders(impls, k_encode),
            peer("pickle-5", lambda: [pickle5(o) for o in p_objs]),
            peer("msgspec (bytes+shapes)", lambda: [menc.encode(o) for o in m_objs]),
            peer("safetensors (+metadata)", lambda: [stnp.save(b, metadata=m) for b, m in st_in]),
        ]),
        Op("decode", [
            floor("np.frombuffer x 4 + str", floor_decode),
            *kiln_contenders(impls, k_decode),
            peer("pickle-5", lambda: [pickle.loads(b) for b in pbufs]),
            peer("msgspec (bytes+shapes)", m_decode),
            peer("safetensors (+metadata)", lambda: [st_sample_decode(b) for b in sbufs]),
        ]),
    ], notes=[
        "Tensors per sample: tokens i32[512], mask u8[512], emb f16[512,64], label i64[1] "
        "(67.6 KB of payload). Every decode row ends with (id, text, {name: ndarray}).",
        "kiln decodes tensors as views of the input buffer; pickle-5 (in-band) and "
        "safetensors copy; msgspec decodes the payload as a zero-copy memoryview "
        "(np.frombuffer + reshape per tensor).",
        "safetensors keeps id and text in its string metadata, read back by parsing "
        "the JSON header.",
    ])
