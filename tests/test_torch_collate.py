"""kiln.torch.collate: a DataLoader over a record file whose records hold
tensors (issue 60 item 14), against torch's own default_collate of the same
values built as numpy arrays by hand; both kernels (``api``)."""

import dataclasses

import numpy as np
import pytest

import kiln

SAMPLE = "struct{id:i64,label:i32,image:tensors,}"


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


def _images(i):
    return {"pixels": np.full((2, 3), i, np.uint8), "mask": np.arange(4, dtype=np.float32) + i}


@pytest.fixture
def records(tmp_path):
    path = str(tmp_path / "train.kilnr")
    with kiln.RecordWriter(path, SAMPLE) as w:
        for i in range(10):
            w.write({"id": i, "label": i % 3, "image": _images(i)})
    return path


def test_a_dataloader_batches_records_with_tensors(api, torch, records):
    import kiln.torch
    from torch.utils.data import DataLoader, default_collate
    with kiln.RecordFile(records, SAMPLE) as rf:
        with pytest.raises(TypeError, match="kiln"):   # what the issue met
            next(iter(DataLoader(rf, batch_size=4)))
        batches = list(DataLoader(rf, batch_size=4, collate_fn=kiln.torch.collate))
    assert [len(b["id"]) for b in batches] == [4, 4, 2]
    for n, b in enumerate(batches):
        # the same records made by hand with numpy arrays, through torch's own collate
        want = default_collate([{"id": i, "label": i % 3, "image": _images(i)}
                                for i in range(4 * n, min(4 * n + 4, 10))])
        assert b.keys() == want.keys() and b["image"].keys() == want["image"].keys()
        assert torch.equal(b["id"], want["id"]) and torch.equal(b["label"], want["label"])
        for k in want["image"]:
            assert b["image"][k].dtype == want["image"][k].dtype
            assert torch.equal(b["image"][k], want["image"][k])


def test_dataclass_records_bf16_and_owned_memory(api, torch, tmp_path):
    import kiln.torch

    @dataclasses.dataclass
    class Row:
        id: kiln.I64
        x: kiln.TensorDirectory

    path = str(tmp_path / "rows.kilnr")
    w16 = kiln.Tensor(b"\x80\x3f\x00\xc0", dtype="bf16", shape=(2,), name="w")
    with kiln.RecordWriter(path, Row) as w:
        w.write(Row(1, kiln.TensorDirectory([w16])))
        w.write(Row(2, kiln.TensorDirectory([w16])))
    with kiln.RecordFile(path, Row) as rf:
        batch = kiln.torch.collate([rf[0], rf[1]])
    assert batch["id"].tolist() == [1, 2]
    assert batch["x"]["w"].dtype == torch.bfloat16
    assert batch["x"]["w"].tolist() == [[1.0, -2.0], [1.0, -2.0]]
    one = kiln.torch.to_torch(kiln.TensorDirectory([w16]))["w"]
    one.add_(1)   # its own memory
    assert w16.bits().tolist() == [0x3F80, 0xC000]
    u4 = kiln.Tensor(b"\x21", dtype="u4", shape=(2,), name="q")
    with pytest.raises(kiln.KilnError, match="torch has no dtype"):
        kiln.torch.collate([{"q": u4}])
