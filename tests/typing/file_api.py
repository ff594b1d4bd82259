"""User code over the file API, checked by mypy --strict and pyright's strict
mode (tests/test_typing_files.py), and run: every line is real usage."""

import dataclasses
import pathlib
import sys
import tempfile
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

import kiln
import kiln.remote


@dataclasses.dataclass
class Step:
    id: int
    loss: kiln.F32


def read_x(path: str) -> npt.NDArray[np.float32]:
    with kiln.open(path) as f:
        return f["x"].numpy()


def mapping_api(path: pathlib.Path) -> None:
    with kiln.open(path) as f:       # a Path: a file or a set
        assert isinstance(f, kiln.KilnFile)
        local: kiln.KilnFile = f
        names: List[str] = f.keys()
        assert names == ["x", "y"] and list(f) == names and len(f) == 2
        assert "x" in f and "z" not in f
        pairs: List[Tuple[str, kiln.Tensor]] = f.items()
        tensors: List[kiln.Tensor] = f.values()
        assert [n for n, _ in pairs] == names and len(tensors) == 2
        maybe: Optional[kiln.Tensor] = f.get("z")
        assert maybe is None and f.get("x") is not None
        y: kiln.Tensor = f.get("y", f["x"])
        assert y.shape == (3,)
        rows: np.ndarray = f.rows("x", 0, 1)
        assert rows.tolist() == [1.0]
        d: kiln.TensorDirectory = f.tensors()
        assert d.keys() == names
        meta: Optional[Dict[str, object]] = local.metadata
        if TYPE_CHECKING:   # a dict or None, not Any
            from typing_extensions import assert_type
            assert_type(local.metadata, Optional[Dict[str, Any]])
        assert meta == {"epoch": 2}
        as_dict: Dict[str, kiln.Tensor] = dict(f)
        assert sorted(as_dict) == names


def any_file(f: "kiln.KilnFile | kiln.remote.RemoteFile | kiln.ShardedFile") -> int:
    return len(f) + sum(t.nbytes for t in f.values())


def a_set(folder: str) -> None:
    # the docs' example of a set (kiln.ShardedFile): f.shards of whatever kiln.open gives
    kiln.save_sharded({"a": np.arange(4.0), "b": np.ones(2)}, folder + "/set",
                      max_shard_size=32)
    with kiln.open(folder + "/set/model.kiln.index.json") as f:
        shards: List[str] = f.shards
        assert shards == ["model-00001-of-00002.kiln", "model-00002-of-00002.kiln"]
        assert f.rows("a", 1, 3).tolist() == [1.0, 2.0]
    with kiln.open(pathlib.Path(folder) / "set") as g:
        assert isinstance(g, kiln.ShardedFile) and g.aliases == {}
    with kiln.open(folder + "/m.kiln") as h:
        assert h.shards == ["m.kiln"]


def main(folder: str) -> None:
    path = folder + "/m.kiln"
    kiln.save_tensors(path, {"x": np.arange(1, 4, dtype=np.float32),
                             "y": np.zeros(3, np.int16)}, metadata={"epoch": 2}, checksum=True)
    assert read_x(path).tolist() == [1.0, 2.0, 3.0]
    mapping_api(pathlib.Path(path))
    a_set(folder)
    with kiln.open(path, verify=True) as f:
        assert any_file(f) == 2 + 12 + 6
        f.verify() if isinstance(f, kiln.KilnFile) else None
    n: int = kiln.convert.convert(path, folder + "/m.safetensors")
    assert n == 2
    kiln.convert.convert(folder + "/m.safetensors", folder + "/c.kiln", checksum=True)
    with open(path, "rb") as fo:
        g: kiln.KilnFile = kiln.open(fo)
        g.close()
    d: kiln.TensorDirectory = kiln.load_tensors(path, copy=True, verify=True)
    assert d["y"].numpy().tolist() == [0, 0, 0]
    x = np.empty(3, np.float32)
    y = np.full(3, 7, np.int16)
    kiln.load_tensors(path, into={"x": x, "y": y})
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [0, 0, 0]
    d["x"].copy_into(x)
    d.copy_into({"y": memoryview(bytearray(6)).cast("B").cast("h")}, strict=False)
    meta: Optional[Dict[str, object]] = kiln.load_metadata(path)
    assert meta == {"epoch": 2}

    rec = folder + "/r.kiln"
    kiln.save(rec, Step(3, 0.5), Step)
    step: Step = kiln.load(rec, Step)           # typed as the class given
    assert step.id == 3
    kiln.save(rec, [1.5], "list<f64>")
    anything = kiln.load(rec, "list<f64>")
    assert anything.tolist() == [1.5]

    with kiln.TensorWriter(folder + "/w.kiln", metadata={"k": "v"}, checksum=True) as w:
        w.add("a", "f32", (2,))
        w.write("a", np.ones(2, np.float32))
    assert kiln.load_tensors(folder + "/w.kiln", verify=True)["a"].numpy().tolist() == [1.0, 1.0]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(folder)
    sys.stdout.write("ok\n")
