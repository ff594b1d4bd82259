"""Atomic replace keeps what it replaces (modes, symbolic links), its temporary
names never collide, and TensorWriter never commits a file a reader refuses;
both implementations."""

import errno
import os
import stat
import struct
import sys
import threading

import numpy as np
import pytest

import kiln
from kiln.convert import convert

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes and symbolic links")


def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def umask_mode(folder):
    """The mode a new file gets here: made with the standard library, not kiln."""
    probe = os.path.join(folder, "probe")
    with open(probe, "wb"):
        pass
    m = mode(probe)
    os.unlink(probe)
    return m


def tmp_files(folder):
    return [n for n in os.listdir(folder) if n.endswith(".kiln-tmp")]


def save_tensors(p):
    kiln.save_tensors(p, {"w": np.arange(4, dtype=np.float32)})


def save_value(p):
    kiln.save(p, {"id": 3}, "struct{id:i64,}")


def writer(p):
    with kiln.TensorWriter(p) as w:
        w.add("w", "f32", (4,))
        w.write("w", np.arange(4, dtype=np.float32))


def converted(p):
    src = str(p) + ".src.npz"
    np.savez(src, w=np.arange(4, dtype=np.float32))
    convert(src, str(p))
    os.unlink(src)


SAVERS = [save_tensors, save_value, writer, converted]


@pytest.mark.parametrize("save", SAVERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("old", [0o600, 0o640, 0o444, 0o755])
def test_a_save_keeps_the_mode_of_the_file_it_replaces(api, tmp_path, save, old):
    p = tmp_path / "m.kiln"
    p.write_bytes(b"old")
    os.chmod(p, old)
    save(p)
    assert mode(p) == old
    assert p.read_bytes() != b"old" and tmp_files(tmp_path) == []


@pytest.mark.parametrize("save", SAVERS, ids=lambda f: f.__name__)
def test_a_new_file_gets_the_mode_of_any_new_file(api, tmp_path, save):
    p = tmp_path / "n.kiln"
    save(p)
    assert mode(p) == umask_mode(tmp_path)


@pytest.mark.parametrize("old", [0o600, 0o640, 0o400])
def test_the_temporary_file_is_never_more_readable_than_the_old_one(api, tmp_path, old):
    p = tmp_path / "t.kiln"
    p.write_bytes(b"secret")
    os.chmod(p, old)
    w = kiln.TensorWriter(p)
    (tmp,) = tmp_files(tmp_path)
    assert mode(tmp_path / tmp) & ~old == 0     # no bit the old file did not have
    w.add("w", "u8", (3,))
    w.write("w", np.zeros(3, np.uint8))
    w.close()
    assert mode(p) == old and kiln.load_tensors(p)["w"].numpy().tolist() == [0, 0, 0]


@pytest.mark.parametrize("save", SAVERS, ids=lambda f: f.__name__)
def test_a_symbolic_link_is_written_through_to_its_target(api, tmp_path, save):
    real = tmp_path / "real"
    real.mkdir()
    target = real / "t.kiln"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    links = tmp_path / "links"
    links.mkdir()
    link = links / "l.kiln"
    os.symlink(os.path.relpath(target, links), link)
    save(link)
    assert os.path.islink(link) and os.readlink(link) == os.path.relpath(target, links)
    assert target.read_bytes() != b"old" and mode(target) == 0o640
    assert sorted(os.listdir(links)) == ["l.kiln"] and tmp_files(real) == []
    with open(link, "rb") as f:
        assert f.read() == target.read_bytes()


def test_a_link_to_a_missing_file_creates_the_target(api, tmp_path):
    link = tmp_path / "l.kiln"
    os.symlink("made.kiln", link)
    save_tensors(link)
    assert os.path.islink(link) and (tmp_path / "made.kiln").is_file()
    assert kiln.load_tensors(link)["w"].numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_link_that_loops_is_refused_before_anything_is_written(api, tmp_path):
    a, b = tmp_path / "a.kiln", tmp_path / "b.kiln"
    os.symlink("b.kiln", a)
    os.symlink("a.kiln", b)
    for save in SAVERS[:3]:
        with pytest.raises(OSError) as e:
            save(a)
        assert e.value.errno == errno.ELOOP
    assert sorted(os.listdir(tmp_path)) == ["a.kiln", "b.kiln"]


def test_threads_saving_to_one_path_never_collide(api, tmp_path):
    p = tmp_path / "c.kiln"
    arrays = [np.full(64, k, np.int32) for k in range(8)]
    errors = []

    def save(k):
        try:
            for _ in range(25):
                kiln.save_tensors(p, {"w": arrays[k]})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=save, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    last = kiln.load_tensors(p)["w"].numpy()
    assert any(np.array_equal(last, a) for a in arrays) and tmp_files(tmp_path) == []


def test_temporary_names_differ_for_every_writer(api, tmp_path):
    p = tmp_path / "u.kiln"
    ws = [kiln.TensorWriter(p) for _ in range(50)]
    assert len(set(tmp_files(tmp_path))) == 50
    for w in ws:
        w.discard()
    assert os.listdir(tmp_path) == []


# --- TensorWriter never commits a file a reader refuses ----------------------------

D0 = 64   # the first descriptor's offset in the file


@pytest.mark.parametrize("args, kw, code, offset", [
    (("x", 4098, (16,)), dict(nbytes=16, block_size=16), "TYPE", D0 + 8),    # no layout
    (("x", 4098, (16,)), dict(nbytes=16, layout="ggml.Q4"), "TYPE", D0 + 12),  # no block size
    (("x", 4098, (16,)), dict(layout="ggml.Q4", block_size=16), "TYPE", D0 + 40),  # no nbytes
    (("x", 4098, (16,)), dict(nbytes=20, layout="q", block_size=16), "TYPE", D0 + 40),
    (("x", "f32", (2, -1)), {}, "TYPE", D0 + 48 + 8),
    (("x", "f32", (2 ** 64,)), {}, "TYPE", D0 + 48),
    (("x", "f32", (1,) * 9), {}, "TYPE", D0 + 2),
    (("x", "u8", (2 ** 32, 2 ** 32)), {}, "LIMIT", D0 + 48),
    (("x", "f64", (2 ** 62,)), {}, "LIMIT", D0 + 40),                        # bytes overflow
    (("x", "f32", (2,)), dict(layout="ggml.Q4"), "TYPE", D0 + 8),
    (("x", "f32", (2,)), dict(block_size=4), "TYPE", D0 + 12),
    (("", "f32", (2,)), {}, "TYPE", D0 + 4),
    (("__metadata__", "u8", (2,)), {}, "TYPE", D0 + 4),
    (("\udc80", "u8", (2,)), {}, "UTF8", D0 + 4),
    (("x", "f33", (2,)), {}, "TYPE", D0),
    (("x", 99, (2,)), {}, "TYPE", D0),
    (("x", "f32", (2.5,)), {}, "TYPE", D0),
    (("x", "f32", (2,)), dict(nbytes=9), "TYPE", D0 + 40),
])
def test_the_writer_refuses_a_declaration_a_reader_would_refuse(api, tmp_path, args, kw, code,
                                                                 offset):
    p = tmp_path / "bad.kiln"
    with pytest.raises(kiln.EncodeError) as e:
        with kiln.TensorWriter(p) as w:
            w.add(*args, **kw)
    assert (e.value.code, e.value.offset) == (code, offset)
    assert os.listdir(tmp_path) == []


def test_opaque_without_a_layout_was_refused_by_the_reader_at_that_offset(api, tmp_path):
    # the oracle for the offset above: the reader's own words on such a table
    p = tmp_path / "o.kiln"
    with kiln.TensorWriter(p) as w:
        w.add("x", 4098, (16,), nbytes=16, layout="ggml.Q4", block_size=16)
        w.write("x", None)
    raw = bytearray(p.read_bytes())
    struct.pack_into("<HH", raw, D0 + 8, 0xFFFF, 0)           # drop the layout slice
    struct.pack_into("<I", raw, 12, struct.unpack_from("<I", raw, 12)[0] - 7)   # heap bytes
    struct.pack_into("<Q", raw, 24, struct.unpack_from("<Q", raw, 24)[0] - 7)
    raw[64 + 128 + 1:64 + 128 + 8] = bytes(7)                   # the layout name, now padding
    with pytest.raises(kiln.KilnError) as e:
        kiln.decode_tensors(bytes(raw))
    assert (e.value.code, e.value.offset) == ("TYPE", D0 + 8)


def test_a_name_declared_twice(api, tmp_path):
    p = tmp_path / "d.kiln"
    with pytest.raises(kiln.EncodeError) as e:
        with kiln.TensorWriter(p) as w:
            w.add("a", "u8", (1,))
            w.add("b", "u8", (1,))
            w.add("a", "u8", (1,))
    assert (e.value.code, e.value.offset) == ("TYPE", D0 + 2 * 128 + 4)
    assert os.listdir(tmp_path) == []


def test_payload_bytes_a_reader_refuses_are_never_committed(api, tmp_path):
    p = tmp_path / "b.kiln"
    p.write_bytes(b"old")
    # a numpy bool array can hold any byte; a kiln.Tensor with a bad bool byte
    # or 4-bit tail cannot be built at all (tests/test_construction.py)
    bad_bool = np.frombuffer(b"\x00\x02", np.bool_)
    for t, at in ((bad_bool, 1),):
        with pytest.raises(kiln.EncodeError) as e:
            with kiln.TensorWriter(p) as w:
                w.add("x", "bool", t.shape)
                w.write("x", t)
        assert e.value.code == "TYPE"
        head = e.value.offset - at
        assert head % 64 == 0 and head >= 64 + 128
        with pytest.raises(kiln.EncodeError):
            kiln.save_tensors(p, {"x": t})
        assert p.read_bytes() == b"old" and tmp_files(tmp_path) == []
    with pytest.raises(kiln.EncodeError):
        with kiln.TensorWriter(p) as w:
            w.add("x", "bool", (4, 2))
            w.write_rows("x", 0, np.zeros((2, 2), np.bool_))
            w.write_rows("x", 2, np.frombuffer(b"\x00\x01\x05\x00", np.bool_).reshape(2, 2))
    assert p.read_bytes() == b"old" and tmp_files(tmp_path) == []


def test_what_the_writer_commits_the_reader_accepts(api, tmp_path):
    p = tmp_path / "ok.kiln"
    with kiln.TensorWriter(p, metadata={"k": 1}) as w:
        w.add("q", 4098, (32,), nbytes=18, layout="ggml.Q4_0", block_size=18)
        w.add("b", "bool", (3,))
        w.add("n", "u4", (3,))
        w.write("q", kiln.Tensor(bytes(range(18)), dtype=4098, shape=(32,), layout="ggml.Q4_0",
                                 block_size=18))
        w.write("b", np.array([True, False, True]))
        w.write("n", kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,)))
    d = kiln.load_tensors(p)
    assert d["q"].layout == "ggml.Q4_0" and bytes(d["q"].data) == bytes(range(18))
    assert d["b"].numpy().tolist() == [True, False, True] and kiln.load_metadata(p) == {"k": 1}


# -- temporary names (issue 38 items 9 and 15) -----------------------------------

def test_a_stale_name_with_a_huge_pid_is_left_alone_and_the_save_works(tmp_path):
    """A leftover '.<name>.<pid>.<hex>.kiln-tmp' whose pid is past any process id
    (once: OverflowError from os.kill) is not a kiln writer's: never parsed as one,
    never removed, and the save goes on."""
    target = tmp_path / "w.kiln"
    for pid in ("99999999999999999999", "4294967296", "0"):
        stray = tmp_path / (".w.kiln.%s.0123456789abcdef.kiln-tmp" % pid)
        stray.write_bytes(b"not ours")
        kiln.save_tensors(str(target), {"w": np.arange(3, dtype=np.int32)})
        assert stray.read_bytes() == b"not ours"
        assert kiln.load_tensors(str(target))["w"].numpy().tolist() == [0, 1, 2]


def test_a_target_name_at_the_folder_limit_saves_atomically(tmp_path):
    """A legal name of up to the folder's limit (255 bytes here) saves: the
    temporary name is kept within the limit (once: errno 36 past ~220 bytes)."""
    limit = os.pathconf(str(tmp_path), "PC_NAME_MAX")
    for name in ("a" * (limit - 5) + ".kiln", "é" * ((limit - 5) // 2) + ".kiln"):
        assert len(os.fsencode(name)) <= limit
        target = tmp_path / name
        open(target, "wb").close()            # a plain open of the name works
        kiln.save_tensors(str(target), {"w": np.ones(2, np.float32)})
        assert kiln.load_tensors(str(target))["w"].numpy().tolist() == [1.0, 1.0]
        kiln.save_tensors(str(target), {"w": np.zeros(2, np.float32)})   # and replaces
        assert kiln.load_tensors(str(target))["w"].numpy().tolist() == [0.0, 0.0]
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".kiln-tmp")]


def _free_threads_done():
    for t in threading.enumerate():
        if t.name == "kiln-free-replaced":
            t.join(30)


def test_a_large_file_replaced_is_freed_after_the_save_and_nothing_leaks(api, tmp_path):
    """A save over a file of FREE_LATER bytes or more holds the old file open
    across the rename and closes it on another thread: a reader of the old
    generation still reads it, the new file is whole, and once that thread is
    done no descriptor is left open."""
    from kiln._files import pagecache
    p = tmp_path / "big.kiln"
    old = np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)
    kiln.save_tensors(p, {"w": old})
    _free_threads_done()
    fds = set(os.listdir("/proc/self/fd"))
    with kiln.open(p) as f:
        seen = f["w"].numpy()
        kiln.save_tensors(p, {"w": np.full(8, 2.5, np.float32)})
        assert float(seen[0]) == 1.5 and float(seen[-1]) == 1.5   # the old generation
    del seen   # (its mapping holds a descriptor of its own)
    with kiln.open(p) as f:
        assert f["w"].numpy().tolist() == [2.5] * 8
    _free_threads_done()
    assert set(os.listdir("/proc/self/fd")) == fds


def test_a_replaced_sets_large_shards_are_freed_after_the_save(api, tmp_path, monkeypatch):
    """A set saved over another: its old shards are removed before the save
    returns (no name of them is left), a large one held open across its
    removal and closed on the freeing thread (each such shard once), and
    nothing stays open once that thread is done."""
    from kiln._files import pagecache
    held = []
    real = pagecache.hold_old

    def spy(path):
        fd = real(path)
        held.append((os.path.basename(path), fd is not None))
        return fd

    monkeypatch.setattr(pagecache, "hold_old", spy)
    big = np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)
    t = {"a": big, "b": big.copy(), "c": np.ones(4, np.float32)}
    kiln.save_sharded(t, tmp_path / "s", max_shard_size=pagecache.FREE_LATER)
    first = sorted(n for n in os.listdir(tmp_path / "s") if n.endswith(".kiln"))
    _free_threads_done()
    fds = set(os.listdir("/proc/self/fd"))
    held.clear()
    kiln.save_sharded(t, tmp_path / "s", max_shard_size=pagecache.FREE_LATER)
    now = sorted(n for n in os.listdir(tmp_path / "s") if n.endswith(".kiln"))
    assert not set(first) & set(now) and len(now) == len(first) == 3
    # the three old shards: the two of FREE_LATER bytes and more held, the small one not
    dropped = {name: took for name, took in held if name in first}
    assert sorted(dropped.values()) == [False, True, True], held
    _free_threads_done()
    assert set(os.listdir("/proc/self/fd")) == fds
    with kiln.open(tmp_path / "s") as f:
        assert f["b"].numpy()[-1] == 1.5


def test_holding_the_old_file_takes_only_a_large_regular_file_and_never_blocks(tmp_path):
    from kiln._files import pagecache
    big, small = tmp_path / "big", tmp_path / "small"
    with open(big, "wb") as f:
        f.truncate(pagecache.FREE_LATER)
    small.write_bytes(b"x" * 100)
    fd = pagecache.hold_old(str(big))
    assert fd is not None and os.fstat(fd).st_ino == os.stat(big).st_ino
    os.close(fd)
    assert pagecache.hold_old(str(small)) is None
    assert pagecache.hold_old(str(tmp_path / "missing")) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # a FIFO with no writer: an open without O_NONBLOCK would wait for one forever
    code = "import sys; from kiln._files import pagecache; print(pagecache.hold_old(sys.argv[1]))"
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "None", r.stderr


def _resident(path):
    """The fraction of the file ``path`` names in the page cache, by
    ``mincore`` over a mapping made and dropped here."""
    import ctypes
    import mmap
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        a = np.frombuffer(m, np.uint8)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        assert libc.mincore(ctypes.c_void_p(a.ctypes.data), size, vec) == 0, ctypes.get_errno()
        del a
        return sum(v & 1 for v in vec) / pages
    finally:
        m.close()


def _cached(path):
    """``path`` read whole (its pages cached) and a second name of it (a hard
    link: neither a mapping nor an open descriptor) to look at it by once
    it is replaced."""
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
    link = str(path) + ".old"
    os.link(path, link)
    assert _resident(link) > 0.9
    return link


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="mincore, /proc/self/maps and /proc/self/fd")


@LINUX
def test_a_save_over_a_large_file_gives_its_cached_pages_back_first(api, tmp_path):
    """The old file's cached pages are dropped before the new bytes are
    written (the new file takes them, not fresh memory): the old
    generation is whole on disk but no longer in memory; a small file
    replaced keeps its pages."""
    from kiln._files import pagecache
    p, q = tmp_path / "big.kiln", tmp_path / "small.kiln"
    kiln.save_tensors(p, {"w": np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)})
    kiln.save_tensors(q, {"w": np.full(1024, 1.5, np.float32)})
    old, small = _cached(p), _cached(q)
    kiln.save_tensors(p, {"w": np.full(8, 2.5, np.float32)})
    kiln.save_tensors(q, {"w": np.full(8, 2.5, np.float32)})
    assert _resident(old) < 0.1 and _resident(small) > 0.9
    with kiln.open(old) as f:   # read back from disk, as it was
        assert f["w"].numpy()[-1] == 1.5


def _map_alone(path):
    """A read-only mapping of ``path`` with no descriptor left open (as
    torch's ``from_file``, and so safetensors' ``load_file``, map a file),
    its first page touched: ``(libc, address, size)``."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
    finally:
        os.close(fd)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    assert ctypes.string_at(addr, 4) == open(path, "rb").read(4)
    return libc, addr, size


@LINUX
@pytest.mark.parametrize("how", ["mapped", "mapped alone", "open"])
def test_a_file_this_process_maps_or_has_open_keeps_its_pages_when_saved_over(
        api, tmp_path, how):
    """The tensors being saved may view the file they replace, or a reader
    here copy from it: a file this process maps (only a part of it so far:
    through kiln, or alone, with no descriptor open) or holds a descriptor
    of keeps all of its cached pages."""
    from kiln._files import pagecache
    p = tmp_path / "big.kiln"
    kiln.save_tensors(p, {"w": np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)})
    old = _cached(p)
    w = fd = alone = None
    if how == "mapped":
        with kiln.open(p) as f:
            w = f["w"].numpy()[:16]
            del f
    elif how == "open":
        fd = os.open(p, os.O_RDONLY)
    else:
        alone = _map_alone(p)
    try:
        kiln.save_tensors(p, {"w": np.full(16, 2.5, np.float32) if w is None else w + 1})
        assert _resident(old) > 0.9
    finally:
        if fd is not None:
            os.close(fd)
        if alone is not None:
            alone[0].munmap(alone[1], alone[2])
    del w


@LINUX
def test_a_set_saved_over_another_gives_the_old_shards_pages_back_first(api, tmp_path):
    from kiln._files import pagecache
    big = np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)
    folder = tmp_path / "s"
    kiln.save_sharded({"a": big, "b": big + 1}, folder, max_shard_size=pagecache.FREE_LATER)
    old = [_cached(folder / n) for n in sorted(os.listdir(folder)) if n.endswith(".kiln")]
    assert len(old) == 2
    kiln.save_sharded({"a": big}, folder)
    assert all(_resident(x) < 0.1 for x in old)


@LINUX
def test_a_conversion_into_a_set_gives_the_old_shards_pages_back_first(api, tmp_path):
    pytest.importorskip("safetensors")
    from kiln._files import pagecache
    big = np.full(pagecache.FREE_LATER // 4 + 1024, 1.5, np.float32)
    kiln.save_sharded({"a": big}, tmp_path / "k")
    st_index = str(tmp_path / "st" / "model.safetensors.index.json")
    convert(str(tmp_path / "k" / "model.kiln.index.json"), st_index)
    out = str(tmp_path / "out" / "model.kiln.index.json")
    convert(st_index, out)
    (shard,) = [n for n in os.listdir(tmp_path / "out") if n.endswith(".kiln")]
    old = _cached(tmp_path / "out" / shard)
    convert(st_index, out)
    assert _resident(old) < 0.1
    with kiln.open(out) as f:
        assert f["a"].numpy()[-1] == 1.5
