"""Typed metadata through safetensors (issue 39, item 6): kiln -> safetensors
-> kiln gives the typed values back from the reserved __metadata__ key
"kiln.metadata" (base64 of the framed Kiln metadata value); the plain keys
stay strings for every other reader; a malformed or stale reserved key is a
ConvertError; a Kiln key named "kiln.metadata" is refused.  Both kernels.

Oracles: the safetensors package reads the header, the reference decoder
(spec/reference/kiln_ref.py) reads the reserved key's value, hand-written
expected strings."""

import base64
import json
import struct

import numpy as np
import pytest

import kiln
from _util import kiln_ref



@pytest.fixture(autouse=True)
def _needs_safetensors():
    pytest.importorskip("safetensors.numpy")   # each test: skipped naming the package


META_TYPE = ("list<struct{parent:u32,key:opt<str>,kind:u8,int:i64,float:f64,text:str,"
             "raw:list<u8>,}>")
TYPED = {"step": 3, "cfg": {"lr": 0.1, "sizes": [1, 2]}, "name": "run-7", "raw": b"\x00\xff",
         "none": None, "on": True, "big": -(2 ** 62)}


def _st_meta(path):
    import safetensors
    with safetensors.safe_open(str(path), "np") as f:
        return f.metadata()


def _convert(a, b):
    kiln.convert.convert(str(a), str(b))


def test_typed_metadata_survives_safetensors_both_ways(api, tmp_path):
    src, st, back = tmp_path / "a.kiln", tmp_path / "a.safetensors", tmp_path / "b.kiln"
    kiln.save_tensors(src, {"w": np.ones(3, np.float32)}, metadata=TYPED)
    _convert(src, st)
    plain = _st_meta(st)
    assert {k: v for k, v in plain.items() if k != "kiln.metadata"} == {
        "step": "3", "cfg": '{"lr": 0.1, "sizes": [1, 2]}', "name": "run-7", "raw": '"00ff"',
        "none": "null", "on": "true", "big": "-4611686018427387904"}
    nodes = kiln_ref.decode(base64.b64decode(plain["kiln.metadata"]), META_TYPE, True)
    top = {n["key"]: n for n in nodes if n["parent"] == 0 and n["key"] is not None}
    assert set(top) == set(TYPED) and top["step"]["int"] == 3 and top["raw"]["raw"] == b"\0\xff"
    _convert(st, back)
    assert kiln.load_metadata(back) == TYPED   # before: {'step': '3', 'cfg': '{"lr": ...}', ...}
    assert kiln.load_tensors(back)["w"].numpy().tolist() == [1.0, 1.0, 1.0]


def test_string_metadata_stays_plain(api, tmp_path):
    src, st = tmp_path / "a.kiln", tmp_path / "a.safetensors"
    kiln.save_tensors(src, {"w": np.ones(1)}, metadata={"format": "pt", "x": "1"})
    _convert(src, st)
    assert _st_meta(st) == {"format": "pt", "x": "1"}   # no reserved key when all are strings
    import safetensors.numpy as stnp
    stnp.save_file({"w": np.ones(2)}, str(st), metadata={"format": "pt", "step": "3"})
    _convert(st, tmp_path / "b.kiln")
    assert kiln.load_metadata(tmp_path / "b.kiln") == {"format": "pt", "step": "3"}


def test_a_kiln_key_named_like_the_reserved_one_is_refused(api, tmp_path):
    src, st = tmp_path / "a.kiln", tmp_path / "a.safetensors"
    kiln.save_tensors(src, {"w": np.ones(1)}, metadata={"kiln.metadata": "mine", "n": 1})
    with pytest.raises(kiln.KilnError) as e:
        _convert(src, st)
    assert e.value.code == "TYPE" and "kiln.metadata" in e.value.reason and "reserved" in \
        e.value.reason
    assert not st.exists()


def _with_meta(path, meta):
    import safetensors.numpy as stnp
    stnp.save_file({"w": np.ones(2, np.float32)}, str(path), metadata=meta)
    n = struct.unpack_from("<Q", path.read_bytes())[0]
    return 8 + path.read_bytes()[8:8 + n].find(b'"kiln.metadata"')


def _blob(meta):
    from kiln._access import metadata_blob
    return base64.b64encode(metadata_blob(meta)).decode()


@pytest.mark.parametrize("meta, words", [
    ({"kiln.metadata": "not base64!"}, "base64"),
    ({"kiln.metadata": base64.b64encode(b"KLN0 garbage").decode()}, "Kiln metadata"),
    ({"kiln.metadata": base64.b64encode(b"").decode()}, "Kiln metadata"),
    ({"kiln.metadata": "\u00e9t\u00e9"}, "base64"),
])
def test_a_malformed_reserved_key_is_a_convert_error(api, tmp_path, meta, words):
    st = tmp_path / "a.safetensors"
    at = _with_meta(st, meta)
    with pytest.raises(kiln.KilnError) as e:
        _convert(st, tmp_path / "b.kiln")
    assert (e.value.code, e.value.offset) == ("TYPE", at) and words in e.value.reason
    assert not (tmp_path / "b.kiln").exists()


def test_a_reserved_key_that_disagrees_with_the_plain_keys_is_refused(api, tmp_path):
    st = tmp_path / "a.safetensors"
    for plain in ({"step": "4"}, {}):   # edited after kiln wrote it; a key deleted
        at = _with_meta(st, dict(plain, **{"kiln.metadata": _blob({"step": 3})}))
        with pytest.raises(kiln.KilnError) as e:
            _convert(st, tmp_path / "b.kiln")
        assert (e.value.code, e.value.offset) == ("TYPE", at) and "'step'" in e.value.reason
    # a plain key another tool added is kept as a string beside the typed ones
    _with_meta(st, {"step": "3", "added": "yes", "kiln.metadata": _blob({"step": 3})})
    _convert(st, tmp_path / "b.kiln")
    assert kiln.load_metadata(tmp_path / "b.kiln") == {"step": 3, "added": "yes"}
    assert json.loads(_st_meta(st)["step"]) == 3
