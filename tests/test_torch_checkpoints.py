"""Checkpoints as Hugging Face and torch write them (issue 49, items 1, 3, 4
and 8): a tied weight stored once loads strictly, tied names stored with
different values are refused, the calls safetensors.torch users type
(save_model, save_sharded, save/load, device=), models built on the meta
device loaded with assign=True, and torch's negation and conjugation bits.

Oracles: safetensors.torch (its save_model writes the tied files users
have, its load_model is the behaviour to match), the tensors the test made,
and the reference decoder for what a file stores."""

import json
import os

import numpy as np
import pytest

import kiln
from _util import kiln_ref

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested "
                                            "where it is")
import kiln.torch as kt  # noqa: E402


def _tied():
    m = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16, bias=False))
    m[1].weight = m[0].weight
    return m


def _stored(path):
    with open(path, "rb") as f:
        ts, _ = kiln_ref.read_directory(f.read(), 0)
    return {t["name"]: bytes(t["payload"]) for t in ts if t["name"] != "__metadata__"}


# --- item 1: a tied weight stored once ---------------------------------------------

def test_a_tied_weight_that_safetensors_stored_once_loads_strictly(api, tmp_path):
    st = pytest.importorskip("safetensors.torch")
    src = _tied()
    st.save_model(src, str(tmp_path / "tied.safetensors"))
    kiln.convert.convert(str(tmp_path / "tied.safetensors"), str(tmp_path / "tied.kiln"))
    assert sorted(_stored(tmp_path / "tied.kiln")) == ["0.weight"]   # safetensors' choice
    fresh = _tied()
    assert kt.load_model(fresh, tmp_path / "tied.kiln") == ([], [])
    assert fresh[1].weight is fresh[0].weight
    assert torch.equal(fresh[0].weight, src[0].weight)
    # safetensors' own loader agrees on the same model
    other = _tied()
    missing, unexpected = st.load_model(other, str(tmp_path / "tied.safetensors"))
    assert not missing and not unexpected
    assert torch.equal(other[0].weight, fresh[0].weight)


def test_either_name_of_a_tied_weight_fills_both(api, tmp_path):
    src = _tied()
    for name in ("0.weight", "1.weight"):
        kiln.save_tensors(tmp_path / "one.kiln", {name: src[0].weight.detach().numpy()})
        fresh = _tied()
        assert kt.load_model(fresh, tmp_path / "one.kiln") == ([], [])
        assert torch.equal(fresh[1].weight, src[0].weight) and fresh[1].weight is fresh[0].weight


def test_tied_names_stored_with_different_values_are_refused(api, tmp_path):
    w = torch.randn(16, 8)
    kiln.save_tensors(tmp_path / "two.kiln", {"0.weight": w.numpy(), "1.weight": (w + 1).numpy()})
    fresh = _tied()
    before = fresh[0].weight.detach().clone()
    with pytest.raises(kt.LoadError) as e:
        kt.load_model(fresh, tmp_path / "two.kiln")
    assert "0.weight" in str(e.value) and "1.weight" in str(e.value)
    assert "different values" in str(e.value)
    assert torch.equal(fresh[0].weight, before)   # nothing copied
    # the same bytes under both names load as one
    kiln.save_tensors(tmp_path / "same.kiln", {"0.weight": w.numpy(), "1.weight": w.numpy()})
    assert kt.load_model(fresh, tmp_path / "same.kiln") == ([], [])
    assert torch.equal(fresh[1].weight, w)


def test_an_untied_model_still_misses_what_the_file_lacks(api, tmp_path):
    m = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16, bias=False))
    kt.save_file({"0.weight": m[0].weight}, tmp_path / "half.kiln")
    with pytest.raises(kt.LoadError) as e:
        kt.load_model(m, tmp_path / "half.kiln")
    assert e.value.missing_keys == ["1.weight"]
    assert kt.load_model(m, tmp_path / "half.kiln", strict=False) == (["1.weight"], [])


# --- item 3: the calls safetensors.torch users type ---------------------------------

def test_save_model_keeps_the_name_the_model_registered_first(api, tmp_path):
    src = _tied()
    kt.save_model(src, tmp_path / "m.kiln", metadata={"step": 7})
    assert list(_stored(tmp_path / "m.kiln")) == ["0.weight"]
    with kiln.open(tmp_path / "m.kiln") as f:
        assert f.metadata == {"step": 7, "__kiln_torch_aliases__": {"1.weight": "0.weight"}}
    sd = kt.load_file(tmp_path / "m.kiln")
    assert sorted(sd) == ["0.weight", "1.weight"] and sd["0.weight"] is sd["1.weight"]
    assert torch.equal(sd["0.weight"], src[0].weight)


def test_save_sharded_stores_a_tied_weight_once_and_loads_it_back_shared(api, tmp_path):
    src = _tied()
    src.add_module("2", torch.nn.Linear(16, 4))
    index = kt.save_sharded(src.state_dict(), tmp_path / "set", max_shard_size=600)
    with open(index) as f:
        ix = json.load(f)
    assert sorted(ix["weight_map"]) == ["0.weight", "2.bias", "2.weight"]
    assert ix["metadata"]["__kiln_aliases__"] == {"1.weight": "0.weight"}
    assert ix["metadata"]["total_size"] == (16 * 8 + 16 * 4 + 4) * 4
    # the generic kiln.save_sharded of a state dict stores it once too
    kiln.save_sharded(src.state_dict(), tmp_path / "plain", max_shard_size=600)
    with open(tmp_path / "plain" / "model.kiln.index.json") as f:
        assert json.load(f)["metadata"]["total_size"] == ix["metadata"]["total_size"]
    sd = kt.load_file(tmp_path / "set")
    assert sd["0.weight"] is sd["1.weight"] and torch.equal(sd["1.weight"], src[0].weight)
    fresh = _tied()
    fresh.add_module("2", torch.nn.Linear(16, 4))
    assert kt.load_model(fresh, tmp_path / "set") == ([], [])
    for k, v in src.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_save_and_load_bytes(api):
    a = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    data = kt.save({"a": a, "b": a, "c": torch.tensor([True, False])}, metadata={"x": "y"})
    assert isinstance(data, bytes)
    back = kt.load(data)
    assert list(back) == ["a", "b", "c"] and back["a"] is back["b"]
    assert torch.equal(back["a"], a) and back["c"].tolist() == [True, False]
    back["a"].add_(1)   # owns its memory: the bytes are not changed
    assert torch.equal(kt.load(data)["a"], a)


@pytest.mark.parametrize("call", [
    lambda p: kt.load_file(p), lambda p: kt.load_model(_tied(), p),
    lambda p: kt.save_file({"a": torch.ones(1)}, p), lambda p: kt.save_model(_tied(), p),
])
@pytest.mark.parametrize("data", [b"KLNT\x01\x00model", bytearray(b"x"), memoryview(b"x")])
def test_bytes_where_a_path_is_expected_is_a_type_error(call, data):
    # a file's contents (bytes holding a NUL byte, or a buffer); a bytes path is a path
    # (issue 60 item 11, tests/test_safetensors_calls.py)
    with pytest.raises(TypeError, match="expected a path .* got a file's contents"):
        call(data)


def test_load_model_takes_device_as_safetensors_does(api, tmp_path):
    m = torch.nn.Linear(3, 2)
    kt.save_model(m, tmp_path / "m.kiln")
    fresh = torch.nn.Linear(3, 2)
    assert kt.load_model(fresh, tmp_path / "m.kiln", device="cpu") == ([], [])
    assert torch.equal(fresh.weight, m.weight)


# --- item 4: models built on the meta device ----------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.norm.bias.requires_grad_(False)


def test_a_model_built_on_meta_is_made_from_the_file(api, tmp_path):
    torch.manual_seed(0)
    src = _Net()
    kt.save_model(src, tmp_path / "m.kiln")
    with torch.device("meta"):
        m = _Net()
    assert m.emb.weight.is_meta
    with pytest.raises(kt.LoadError, match="assign=True"):
        kt.load_model(m, tmp_path / "m.kiln")
    assert kt.load_model(m, tmp_path / "m.kiln", assign=True) == ([], [])
    for k, v in src.state_dict().items():
        got = m.state_dict()[k]
        assert got.device.type == "cpu" and torch.equal(got, v), k
    assert m.head.weight is m.emb.weight and isinstance(m.emb.weight, torch.nn.Parameter)
    assert m.emb.weight.requires_grad and not m.norm.bias.requires_grad
    assert "scale" in dict(m.named_buffers())
    x = torch.tensor([1, 2, 3])
    assert torch.equal(m.head(m.norm(m.emb(x) * m.scale)), src.head(src.norm(src.emb(x) * src.scale)))


def test_a_meta_load_checks_everything_before_it_allocates(api, tmp_path):
    src = _Net()
    sd = src.state_dict()
    sd["norm.weight"] = torch.ones(5)   # wrong shape
    kt.save_file(sd, tmp_path / "bad.kiln")
    with torch.device("meta"):
        m = _Net()
    with pytest.raises(kt.LoadError, match="size mismatch for norm.weight"):
        kt.load_model(m, tmp_path / "bad.kiln", assign=True)
    assert all(p.is_meta for p in m.parameters())   # nothing replaced


def test_assign_onto_an_explicit_device_and_from_a_set(api, tmp_path):
    src = _Net()
    kt.save_sharded(src.state_dict(), tmp_path / "set", max_shard_size=100)
    with torch.device("meta"):
        m = _Net()
    assert kt.load_model(m, tmp_path / "set", assign=True, device="cpu") == ([], [])
    assert m.head.weight is m.emb.weight
    for k, v in src.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k


# --- item 8: negation and conjugation bits -------------------------------------------

def test_negation_bits_are_values_and_never_aliases(api, tmp_path):
    z = torch.tensor([1 + 2j, 3 + 4j])
    kt.save_file({"a": z.imag, "b": z.conj().imag}, tmp_path / "n.kiln")
    assert _stored(tmp_path / "n.kiln") == {
        "a": np.array([2, 4], np.float32).tobytes(), "b": np.array([-2, -4], np.float32).tobytes()}
    back = kt.load_file(tmp_path / "n.kiln")
    assert back["a"].tolist() == [2.0, 4.0] and back["b"].tolist() == [-2.0, -4.0]


def test_a_contiguous_negative_bit_tensor_is_stored_by_every_writer(api, tmp_path):
    x = torch.tensor([1 + 2j]).conj().imag
    assert x.is_neg()
    kt.save_file({"x": x}, tmp_path / "a.kiln")
    kiln.save_tensors(tmp_path / "b.kiln", {"x": x})
    want = np.array([-2], np.float32).tobytes()
    assert _stored(tmp_path / "a.kiln") == _stored(tmp_path / "b.kiln") == {"x": want}
    assert kiln.Tensor.from_numpy(x).numpy().tobytes() == want


def test_a_meta_tensor_is_refused_with_what_to_do(api, tmp_path):
    with pytest.raises(kiln.EncodeError) as e:
        kt.save_file({"m": torch.empty(2, device="meta")}, tmp_path / "m.kiln")
    assert "meta device" in str(e.value) and "assign=True" in str(e.value)
    assert ".cpu() first" not in str(e.value)
    assert not os.path.exists(tmp_path / "m.kiln")
