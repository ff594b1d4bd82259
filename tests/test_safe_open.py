"""kiln.torch.safe_open against the real safetensors.safe_open (issue 60 item 1).

The same tensors are saved by safetensors (``.safetensors``) and by kiln
(``.kiln``); every call is made on both and the answers compared, and the
slices also against torch's own indexing of the whole tensor.  That a slice
reads only its bytes is shown on a file cut short after them (the rest of the
tensor is gone: ``get_tensor`` is ``EOF``, the slice still reads).  Both
kernels (``api``).
"""

import os

import numpy as np
import pytest

import kiln
import kiln.torch


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.fixture
def st():
    return pytest.importorskip("safetensors", reason="safetensors is not installed "
                                                     "(pip install 'kiln-wire[safetensors]')")


def _tensors(torch):
    g = torch.Generator().manual_seed(60)
    return {
        "embed.weight": torch.randn(7, 5, 6, generator=g),
        "head.bf16": torch.randn(4, 9, generator=g).to(torch.bfloat16),
        "norm.f16": torch.randn(11, generator=g).to(torch.float16),
        "ids": torch.arange(24, dtype=torch.int64).reshape(2, 3, 4),
        "mask": torch.tensor([[True, False, True], [False, False, True]]),
        "f8": torch.randn(3, 4, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }


@pytest.fixture
def pair(torch, st, tmp_path):
    from safetensors.torch import save_file as st_save
    tensors = _tensors(torch)
    a, b = str(tmp_path / "m.safetensors"), str(tmp_path / "m.kiln")
    st_save(tensors, a, metadata={"format": "pt", "step": "3"})
    kiln.torch.save_file(tensors, b, metadata={"format": "pt", "step": "3"})
    return tensors, a, b


INDEXES = [
    (slice(0, 2),), (1,), (slice(None), slice(1, 3)), (Ellipsis, 2), (-1,),
    (slice(-2, None),), (slice(0, 7, 3),), (slice(5, 10),), (1, 2, 3),
    (slice(None), 1, slice(2, 4)), (), Ellipsis, slice(2, 1), (slice(1, 6, 2), slice(None), 5),
    (slice(None), slice(None), slice(0, 6, 4)),
]


def _same(torch, x, y):
    return x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape) and \
        torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x, 
                    y.view(torch.uint8) if y.dtype.itemsize == 1 else y)


def test_calls_answer_as_safetensors_does(api, torch, pair):
    from safetensors import safe_open as st_open
    tensors, a, b = pair
    with st_open(a, framework="pt", device="cpu") as s, \
            kiln.torch.safe_open(b, framework="pt", device="cpu") as k:
        assert k.keys() == s.keys() == sorted(tensors)
        assert k.metadata() == s.metadata() == {"format": "pt", "step": "3"}
        assert sorted(k.offset_keys()) == sorted(s.offset_keys())
        for name in tensors:
            x, y = k.get_tensor(name), s.get_tensor(name)
            assert _same(torch, x, y) and _same(torch, x, tensors[name]), name
            ks, ss = k.get_slice(name), s.get_slice(name)
            assert ks.get_shape() == ss.get_shape() == list(tensors[name].shape)
            assert ks.get_dtype() == ss.get_dtype()
        for idx in INDEXES:
            want = tensors["embed.weight"][idx]
            got = k.get_slice("embed.weight")[idx]
            assert _same(torch, got, s.get_slice("embed.weight")[idx]), idx
            assert _same(torch, got, want) and got.is_contiguous(), idx
        for name, idx in [("head.bf16", (slice(1, 3), slice(2, 9, 3))), ("mask", (1,)),
                          ("ids", (Ellipsis, 1)), ("f8", (slice(None), -1)),
                          ("scalar", ()), ("empty", (slice(None), 1))]:
            assert _same(torch, k.get_slice(name)[idx], s.get_slice(name)[idx]), name


def test_bad_indexes_are_refused_as_torch_refuses_them(api, torch, pair):
    from safetensors import safe_open as st_open
    _, a, b = pair
    with st_open(a, framework="pt") as s, kiln.torch.safe_open(b, framework="pt") as k:
        for idx in [7, -8, (0, 0, 0, 0), (0, 9)]:
            with pytest.raises(IndexError):
                s.get_slice("embed.weight")[idx]
            with pytest.raises(IndexError):
                k.get_slice("embed.weight")[idx]
        for idx in ["a", None, (slice(None), [0, 1]), True]:
            with pytest.raises(TypeError):
                k.get_slice("embed.weight")[idx]
        with pytest.raises(IndexError, match="single ellipsis"):
            k.get_slice("embed.weight")[..., ...]
        with pytest.raises(ValueError, match="step"):
            k.get_slice("embed.weight")[::-1]


def test_offset_keys_follow_the_payloads_in_the_file(api, torch, pair):
    tensors, _, b = pair
    with open(b, "rb") as fh:
        raw = fh.read()
    with kiln.torch.safe_open(b, framework="pt") as k:
        order = k.offset_keys()
    assert sorted(order) == sorted(tensors)
    # where each tensor's bytes lie, found in the file by their values (unique here)
    found = [(raw.find(tensors[n].contiguous().view(torch.uint8).numpy().tobytes()), n)
             for n in order if tensors[n].numel() > 1]
    assert all(at > 0 for at, _ in found)
    assert [at for at, _ in found] == sorted(at for at, _ in found)


def test_a_slice_reads_only_its_bytes(api, torch, tmp_path):
    # rows of 256 KiB: a slice's runs lie further apart than one read would merge
    x = torch.arange(4 * 65536, dtype=torch.float32).reshape(4, 65536)
    path = str(tmp_path / "w.kiln")
    kiln.torch.save_file({"w": x}, path)
    with kiln.open(path) as f:
        start = kiln._access.file_offset(kiln._access.table(f)["w"])
    with kiln.torch.safe_open(path, framework="pt") as k:
        # cut the file in place after row 3's tenth element: rows 0-2 and row 3's
        # first ten columns are all that is left of the tensor
        os.truncate(path, start + (3 * 65536 + 10) * 4)
        assert torch.equal(k.get_slice("w")[0:3], x[0:3])
        assert torch.equal(k.get_slice("w")[:, 0:10], x[:, 0:10])
        assert torch.equal(k.get_slice("w")[1:, 2:9:3], x[1:, 2:9:3])
        with pytest.raises(kiln.KilnError) as e:
            k.get_slice("w")[:, 0:11]
        assert e.value.code == "EOF" and "w.kiln" in str(e.value)
        with pytest.raises(kiln.KilnError) as e:
            k.get_tensor("w")
        assert e.value.code == "EOF"


def test_reads_come_from_the_file_that_was_opened(api, torch, tmp_path):
    path = str(tmp_path / "m.kiln")
    kiln.torch.save_file({"w": torch.ones(3, 4)}, path)
    with kiln.torch.safe_open(path, framework="pt") as k:
        kiln.torch.save_file({"w": torch.zeros(3, 4)}, path)   # replaced by name
        assert torch.equal(k.get_tensor("w"), torch.ones(3, 4))
        assert torch.equal(k.get_slice("w")[1:2, 1:3], torch.ones(1, 2))
        y = k.get_tensor("w")
        y.add_(1)   # its own memory
        assert torch.equal(k.get_tensor("w"), torch.ones(3, 4))


def test_aliases_checksums_and_refusals(api, torch, tmp_path):
    w = torch.randn(4, 3)
    path = str(tmp_path / "tied.kiln")
    kiln.torch.save_file({"a.weight": w, "b.weight": w}, path, metadata={"k": "v"})
    with kiln.torch.safe_open(path, framework="pt") as k:
        assert k.keys() == ["a.weight", "b.weight"]
        assert k.offset_keys() == ["a.weight", "b.weight"]
        assert k.metadata() == {"k": "v"}   # the reserved alias entry is left out
        assert torch.equal(k.get_tensor("b.weight"), w)
        assert torch.equal(k.get_slice("b.weight")[1:3], w[1:3])
        with pytest.raises(KeyError, match="does not contain tensor 'c'"):
            k.get_tensor("c")
    with pytest.raises(ValueError, match="closed"):
        k.keys()
    with pytest.raises(ValueError, match="closed"):
        k.get_tensor("a.weight")
    with pytest.raises(ValueError, match="framework='pt'"):
        kiln.torch.safe_open(path, framework="np")
    with pytest.raises(TypeError, match="got a file's contents"):
        kiln.torch.safe_open(b"KLNT\x00", framework="pt")
    # no metadata: None, as safetensors
    plain = str(tmp_path / "plain.kiln")
    kiln.save_tensors(plain, {"x": kiln.Tensor.from_numpy(torch.ones(2).numpy())})
    f = kiln.torch.safe_open(plain, framework="pt")
    assert f.metadata() is None and f.keys() == ["x"]
    f.close()
    f.close()
    # a payload that differs from its recorded CRC-32
    crc = str(tmp_path / "crc.kiln")
    kiln.save_tensors(crc, {"x": torch.ones(4).numpy()}, checksum=True)
    with kiln.open(crc) as g:
        at = kiln._access.file_offset(kiln._access.table(g)["x"])
    with open(crc, "r+b") as fh:
        fh.seek(at)
        fh.write(b"\x01")   # 1.0 is 00 00 80 3f
    with kiln.torch.safe_open(crc, framework="pt") as k:
        with pytest.raises(kiln.KilnError) as e:
            k.get_tensor("x")
        assert e.value.code == "CHECKSUM"
    # a dtype torch has none for
    u4 = str(tmp_path / "u4.kiln")
    kiln.save_tensors(u4, [kiln.Tensor(b"\x21", dtype="u4", shape=(2,), name="q")])
    with kiln.torch.safe_open(u4, framework="pt") as k:
        assert k.keys() == ["q"]
        with pytest.raises(kiln.KilnError, match="u4.kiln.*torch has no dtype"):
            k.get_tensor("q")


def test_a_bad_bool_byte_is_refused_by_slices_too(api, torch, tmp_path):
    path = str(tmp_path / "b.kiln")
    kiln.torch.save_file({"m": torch.tensor([True, False, True, True])}, path)
    with kiln.open(path) as g:
        at = kiln._access.file_offset(kiln._access.table(g)["m"])
    with open(path, "r+b") as fh:
        fh.seek(at + 3)
        fh.write(b"\x07")
    with kiln.torch.safe_open(path, framework="pt") as k:
        with pytest.raises(kiln.KilnError):
            k.get_slice("m")[0:2]
        with pytest.raises(kiln.KilnError):
            k.get_tensor("m")


def test_e2m1_is_safetensors_f4_in_get_dtype_and_kiln_convert(api, torch, st, tmp_path):
    """One dtype table (kiln/convert/safetensors.py) for get_dtype() and the
    converter: torch's float4_e2m1fn_x2 is safetensors' F4 and Kiln's e2m1
    (review D2); bytes compared with what safetensors wrote, and an odd count
    of 4-bit values, which F4 cannot hold, refused both ways."""
    from safetensors import safe_open as st_open
    from safetensors.torch import save_file as st_save
    from kiln.convert import convert
    raw = torch.tensor([[0x21, 0x43, 0x0f], [0x65, 0x87, 0xf0]], dtype=torch.uint8)
    q = raw.view(torch.float4_e2m1fn_x2)   # 2 x 6 values
    a, b = str(tmp_path / "q.safetensors"), str(tmp_path / "q.kiln")
    st_save({"q": q}, a)
    kiln.torch.save_file({"q": q}, b)
    with st_open(a, framework="pt") as s, kiln.torch.safe_open(b, framework="pt") as k:
        assert s.get_slice("q").get_dtype() == "F4" == k.get_slice("q").get_dtype()
    convert(a, str(tmp_path / "c.kiln"))
    with kiln.open(str(tmp_path / "c.kiln")) as f:
        t = f["q"]
        assert t.dtype == "e2m1" and t.shape == (2, 6)
        assert bytes(t.data) == bytes(raw.flatten().tolist())
    convert(b, str(tmp_path / "back.safetensors"))
    with open(a, "rb") as x, open(str(tmp_path / "back.safetensors"), "rb") as y:
        assert x.read() == y.read()   # the same header and bytes as safetensors wrote
    odd = str(tmp_path / "odd.kiln")   # 3 values: half a byte of padding
    ml_dtypes = pytest.importorskip("ml_dtypes")
    kiln.save_tensors(odd, {"q": np.array([0.5, 1.0, 1.5], dtype=ml_dtypes.float4_e2m1fn)})
    with pytest.raises(kiln.KilnError) as e:
        convert(odd, str(tmp_path / "odd.safetensors"))
    assert e.value.code == "TYPE" and "odd count" in str(e.value)
    assert not os.path.exists(tmp_path / "odd.safetensors")
    header = b'{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}'
    with open(str(tmp_path / "odd.safetensors"), "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + bytes([0x21, 0x03]))
    with pytest.raises(kiln.KilnError) as e:
        convert(str(tmp_path / "odd.safetensors"), str(tmp_path / "odd2.kiln"))
    assert e.value.code == "TYPE" and "odd count" in str(e.value)
