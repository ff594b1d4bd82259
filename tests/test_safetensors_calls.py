"""What a safetensors user types, and one rule for paths (issue 60 items 4, 5,
11, 12): safetensors bytes named as such at every entry point, safetensors'
keyword names, bytes paths, and a RecordWriter given a folder.

Real safetensors files and bytes (made by safetensors), real files; both
kernels (``api``).
"""

import os

import numpy as np
import pytest

import kiln
import kiln.torch
from kiln.records import RecordFile, RecordWriter


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.fixture
def st_torch():
    return pytest.importorskip("safetensors.torch", reason="safetensors is not installed "
                                                           "(pip install 'kiln-wire[safetensors]')")


HINT = "this is a safetensors file, not Kiln: convert it with kiln convert"


# --- item 4: one detection for every entry point -----------------------------------------

def test_safetensors_bytes_are_named_at_every_entry_point(api, torch, st_torch, tmp_path):
    data = st_torch.save({"w": torch.ones(2, 3)})
    path = tmp_path / "m.safetensors"
    path.write_bytes(data)
    calls = {
        "kiln.torch.load": lambda: kiln.torch.load(data),
        "kiln.decode_tensors": lambda: kiln.decode_tensors(data),
        "kiln.decode_tensors(bytearray)": lambda: kiln.decode_tensors(bytearray(data)),
        "kiln.torch.load_file": lambda: kiln.torch.load_file(str(path)),
        "kiln.torch.safe_open": lambda: kiln.torch.safe_open(str(path), framework="pt"),
        "kiln.open": lambda: kiln.open(str(path)),
        "kiln.load_tensors": lambda: kiln.load_tensors(str(path)),
    }
    for what, call in calls.items():
        with pytest.raises(kiln.KilnError) as e:
            call()
        assert e.value.code == "FRAME" and e.value.offset == 0, what
        assert HINT in str(e.value), what


def test_kiln_bytes_that_are_merely_short_get_no_foreign_hint(api):
    with pytest.raises(kiln.KilnError) as e:
        kiln.decode_tensors(b"KLN")
    assert "not Kiln" not in str(e.value)


# --- item 5: safetensors' keyword names -----------------------------------------------------

def test_safetensors_keyword_names_are_taken(api, torch, st_torch, tmp_path):
    sd = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    path = str(tmp_path / "kw.kiln")
    kiln.torch.save_file(tensors=sd, filename=path, metadata={"k": "v"})
    back = kiln.torch.load_file(filename=path, device="cpu")
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    model = torch.nn.Linear(3, 2)
    mpath = str(tmp_path / "model.kiln")
    kiln.torch.save_model(model, filename=mpath, metadata={"k": "v"}, force_contiguous=True)
    fresh = torch.nn.Linear(3, 2)
    assert kiln.torch.load_model(fresh, filename=mpath, strict=True) == ([], [])
    assert torch.equal(fresh.weight, model.weight)
    # the same keywords work on safetensors itself (the names are theirs)
    st_path = str(tmp_path / "kw.safetensors")
    st_torch.save_file(tensors=sd, filename=st_path)
    st_torch.load_file(filename=st_path)
    with pytest.raises(TypeError, match="'path' and 'filename'"):
        kiln.torch.save_file(sd, path=path, filename=path)
    with pytest.raises(TypeError):
        kiln.torch.save_file(sd, tensors=sd, filename=path)   # state_dict twice


# --- item 11: bytes paths, one rule ---------------------------------------------------------

def test_a_bytes_path_is_a_path_everywhere(api, torch, tmp_path):
    d = os.fsencode(str(tmp_path)) + b"/"
    kiln.save_tensors(d + b"a.kiln", {"x": np.arange(3, dtype=np.int32)})
    assert kiln.open(d + b"a.kiln").keys() == ["x"]
    assert kiln.load_tensors(d + b"a.kiln")["x"].numpy().tolist() == [0, 1, 2]
    kiln.save(d + b"v.kiln", [1, 2], "list<i32>")
    assert kiln.load(d + b"v.kiln", "list<i32>").tolist() == [1, 2]
    assert kiln.save_sharded({"x": np.ones(2)}, d + b"set").endswith("model.kiln.index.json")
    kiln.torch.save_file({"w": torch.ones(2)}, d + b"t.kiln")
    assert torch.equal(kiln.torch.load_file(d + b"t.kiln")["w"], torch.ones(2))
    kiln.torch.save_sharded({"w": torch.ones(2)}, d + b"tset")
    assert torch.equal(kiln.torch.load_file(d + b"tset")["w"], torch.ones(2))
    with kiln.torch.safe_open(d + b"t.kiln", framework="pt") as f:
        assert f.keys() == ["w"]
    with RecordWriter(d + b"r.kilnr", "i32") as w:
        w.write(7)
    with RecordFile(d + b"r.kilnr", "i32") as rf:
        assert list(rf) == [7]
    from kiln.convert import convert   # the converter and the DCP storage too
    assert convert(d + b"a.kiln", d + b"a.safetensors") == 1
    from safetensors.numpy import load_file as st_load
    assert st_load(str(tmp_path / "a.safetensors"))["x"].tolist() == [0, 1, 2]
    import torch.distributed.checkpoint as dcp
    from kiln.torch.distributed import KilnStorageReader, KilnStorageWriter
    dcp.save({"w": torch.ones(2)}, storage_writer=KilnStorageWriter(d + b"dcp"), no_dist=True)
    got = {"w": torch.zeros(2)}
    dcp.load(got, storage_reader=KilnStorageReader(d + b"dcp"), no_dist=True)
    assert torch.equal(got["w"], torch.ones(2))


def test_a_files_contents_given_as_a_path_get_one_message(api, torch, tmp_path):
    kiln.torch.save_file({"w": torch.ones(2)}, str(tmp_path / "t.kiln"))
    data = (tmp_path / "t.kiln").read_bytes()
    calls = {
        "kiln.open": (lambda: kiln.open(data), "kiln.decode_tensors(data)"),
        "kiln.load_tensors": (lambda: kiln.load_tensors(data), "kiln.decode_tensors(data)"),
        "kiln.save_tensors": (lambda: kiln.save_tensors(data, {}), "kiln.encode_tensors"),
        "kiln.save": (lambda: kiln.save(data, 1, "i32"), "kiln.encode(value, type)"),
        "kiln.torch.load_file": (lambda: kiln.torch.load_file(data), "kiln.torch.load(data)"),
        "kiln.torch.save_file": (lambda: kiln.torch.save_file({}, bytearray(data)),
                                 "kiln.torch.save(state_dict)"),
        "RecordWriter": (lambda: RecordWriter(data, "i32"), "io.BytesIO()"),
    }
    for what, (call, advice) in calls.items():
        with pytest.raises(TypeError) as e:
            call()
        msg = str(e.value)
        # the readers share one resolution of their path, whose message says "kiln"
        assert msg.startswith("kiln expected" if what in ("kiln.open", "kiln.load_tensors")
                              else what), (what, msg)
        assert "expected a path (str, bytes or os.PathLike) and got a file's contents" in msg
        assert advice in msg, (what, msg)
    assert os.listdir(str(tmp_path)) == ["t.kiln"]   # nothing written beside anything


# --- item 12: a RecordWriter refuses a folder when it opens -----------------------------

def test_record_writer_refuses_a_folder_at_once(api, tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        RecordWriter(str(tmp_path), "i32")
    assert e.value.filename == str(tmp_path) and "folder" in str(e.value)
    assert os.listdir(str(tmp_path)) == []   # no temporary file left behind
    link = tmp_path / "link"
    (tmp_path / "sub").mkdir()
    link.symlink_to(tmp_path / "sub")
    with pytest.raises(IsADirectoryError):
        RecordWriter(str(link), "i32")
    assert sorted(os.listdir(str(tmp_path))) == ["link", "sub"]
    assert os.listdir(str(tmp_path / "sub")) == []
