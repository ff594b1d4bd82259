"""Hugging Face models through kiln, end to end (issue 49, items 1, 3 and 4).

A tiny GPT-2 (``lm_head`` tied to ``wte``, the tied weight stored once) and
a tiny bf16 LLaMA are saved by ``save_pretrained`` as a sharded safetensors
set, converted by ``kiln convert`` to a kiln set, built again under
``torch.device("meta")`` (no memory), made from the kiln set with
``kiln.torch.load_model(..., assign=True)`` and tied with ``tie_weights()``.

Oracles: ``from_pretrained`` of the safetensors set the kiln set was converted
from (its logits), the model that was saved (its tensors), and the names
``save_pretrained`` and ``safetensors.torch.save_model`` keep.  No network:
configs only, weights from a seeded generator."""

import json
import os

import pytest

import kiln
from kiln.cli import main as kiln_main

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested "
                                            "where it is")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                                          "the Hugging Face path is tested "
                                                          "where it is")
import kiln.torch as kt  # noqa: E402

_SMALL = dict(vocab_size=96, bos_token_id=0, eos_token_id=0)


def _gpt2():
    return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, **_SMALL)


def _llama():
    return transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=16, tie_word_embeddings=False,
                                    **_SMALL)


KINDS = {"gpt2": (_gpt2, torch.float32), "llama": (_llama, torch.bfloat16)}


def _build(kind, meta=False):
    make, dtype = KINDS[kind]
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(make(), dtype=dtype)
    return transformers.AutoModelForCausalLM.from_config(make(), dtype=dtype).eval()


def _remake_computed_buffers(model, device):
    """Buffers a model computes in its constructor and never saves
    (``persistent=False``: LLaMA's rotary ``inv_freq``) are in no checkpoint,
    so a model built on meta still has them there: make that module again on
    the device (as the integrations guide shows)."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is not None:
        with torch.device(device):
            model.model.rotary_emb = type(rotary)(model.config)


def _tensors(model):
    return list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers())


def _saved_set(kind, folder, shard="20KB"):
    """The model saved by save_pretrained as a set of several shards: (model,
    safetensors index path)."""
    src = _build(kind)
    src.save_pretrained(folder, max_shard_size=shard)
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index) as f:
        assert len(set(json.load(f)["weight_map"].values())) > 2   # a set, not one file
    return src, index


def _convert(src, dst):
    assert kiln_main(["convert", str(src), str(dst)]) == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_converted_set_makes_a_meta_model_that_computes_what_from_pretrained_does(
        api, tmp_path, kind):
    src, st_index = _saved_set(kind, tmp_path / "st")
    _convert(st_index, tmp_path / "kiln" / "model.kiln.index.json")
    with kiln.open(tmp_path / "kiln") as f:
        assert isinstance(f, kiln.ShardedFile) and len(f.shards) > 2
        with open(st_index) as g:
            assert sorted(f.keys()) == sorted(json.load(g)["weight_map"])

    m = _build(kind, meta=True)
    assert all(t.is_meta for _, t in _tensors(m))
    assert kt.load_model(m, tmp_path / "kiln", assign=True, device="cpu") == ([], [])
    if kind == "gpt2":   # the file holds wte only; load_model ties lm_head to it again
        assert m.lm_head.weight is m.transformer.wte.weight
    m.tie_weights()
    _remake_computed_buffers(m, "cpu")
    m.eval()

    assert not [n for n, t in _tensors(m) if t.is_meta]
    want = src.state_dict()
    got = m.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    for n, p in m.named_parameters():
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad, n
    if kind == "gpt2":
        assert m.lm_head.weight is m.transformer.wte.weight

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "st", dtype=KINDS[kind][1]).eval()
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = m(ids).logits
        assert logits.dtype == KINDS[kind][1]
        # the weights are equal bit for bit (above); logits within float
        # tolerance: torch's CPU kernels may sum in another order from one call
        # to the next (threads), which the full suite showed once
        torch.testing.assert_close(logits, ref(ids).logits)
        torch.testing.assert_close(logits, src(ids).logits)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_converted_set_fills_a_built_model_strictly(api, tmp_path, kind):
    """The same set into a model that has memory (no assign): copied in place,
    the tied lm_head not missing though the file lacks it."""
    src, st_index = _saved_set(kind, tmp_path / "st")
    _convert(st_index, tmp_path / "kiln" / "model.kiln.index.json")
    torch.manual_seed(5)
    m = transformers.AutoModelForCausalLM.from_config(KINDS[kind][0](),
                                                      dtype=KINDS[kind][1]).eval()
    before = {n: t.data_ptr() for n, t in m.state_dict().items()}
    assert kt.load_model(m, tmp_path / "kiln" / "model.kiln.index.json") == ([], [])
    for k, v in src.state_dict().items():
        assert torch.equal(m.state_dict()[k], v) and m.state_dict()[k].data_ptr() == before[k], k


def test_a_single_file_checkpoint_makes_a_meta_model(api, tmp_path):
    src = _build("gpt2")
    src.save_pretrained(tmp_path / "st")           # one model.safetensors, lm_head not in it
    _convert(tmp_path / "st" / "model.safetensors", tmp_path / "m.kiln")
    with kiln.open(tmp_path / "m.kiln") as f:
        assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()
    m = _build("gpt2", meta=True)
    assert kt.load_model(m, tmp_path / "m.kiln", assign=True) == ([], [])
    m.tie_weights()
    assert m.lm_head.weight is m.transformer.wte.weight
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        torch.testing.assert_close(m.eval()(ids).logits, src(ids).logits)


def test_a_meta_model_and_a_set_that_does_not_fit_it_allocate_nothing(api, tmp_path):
    """Every check before any tensor is made: a LLaMA set loaded into a model of
    another width is refused naming the first tensor, the model left on meta."""
    _, st_index = _saved_set("llama", tmp_path / "st")
    _convert(st_index, tmp_path / "kiln" / "model.kiln.index.json")
    cfg = _llama()
    cfg.intermediate_size = 48
    with torch.device("meta"):
        m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with pytest.raises(kt.LoadError, match=r"size mismatch for model\.layers\.0\.mlp\.") as e:
        kt.load_model(m, tmp_path / "kiln", assign=True, device="cpu")
    assert "model.layers.1.mlp.down_proj.weight" in str(e.value)
    assert all(t.is_meta for _, t in _tensors(m))
    with torch.device("meta"):   # float32 against the set's bf16: no conversion
        m32 = transformers.AutoModelForCausalLM.from_config(_llama(), dtype=torch.float32)
    with pytest.raises(kt.LoadError, match="dtype mismatch"):
        kt.load_model(m32, tmp_path / "kiln", assign=True, device="cpu")
    assert all(t.is_meta for _, t in _tensors(m32))


def test_save_model_keeps_the_name_save_pretrained_keeps(api, tmp_path):
    """kiln.torch.save_model stores a tied weight once, under the name
    save_pretrained keeps (``transformer.wte.weight``: the module that
    registered it first); safetensors.torch.save_model keeps the first in
    sorted order (``lm_head.weight``).  Files of either choice load."""
    sttorch = pytest.importorskip("safetensors.torch")
    src = _build("gpt2")
    src.save_pretrained(tmp_path / "st")
    with open(tmp_path / "st" / "model.safetensors", "rb") as f:
        hf_names = set(json.loads(f.read(int.from_bytes(f.read(8), "little")))) - {"__metadata__"}
    assert "transformer.wte.weight" in hf_names and "lm_head.weight" not in hf_names
    kt.save_model(src, tmp_path / "k.kiln", metadata={"format": "pt"})
    with kiln.open(tmp_path / "k.kiln") as f:
        assert set(f.keys()) == hf_names
        assert f.metadata == {"format": "pt",
                              kt.ALIASES_KEY: {"lm_head.weight": "transformer.wte.weight"}}
    sd = kt.load_file(tmp_path / "k.kiln")
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]
    assert sorted(sd) == sorted(src.state_dict())

    sttorch.save_model(src, str(tmp_path / "s.safetensors"))
    with sttorch.safe_open(str(tmp_path / "s.safetensors"), "pt") as f:
        st_names = set(f.keys())
    assert st_names == hf_names - {"transformer.wte.weight"} | {"lm_head.weight"}
    _convert(tmp_path / "s.safetensors", tmp_path / "s.kiln")
    ids = torch.arange(8).reshape(1, 8)
    for path in ("k.kiln", "s.kiln"):
        m = _build("gpt2", meta=True)
        assert kt.load_model(m, tmp_path / path, assign=True) == ([], []), path
        m.tie_weights()
        assert m.lm_head.weight is m.transformer.wte.weight, path
        with torch.no_grad():
            torch.testing.assert_close(m.eval()(ids).logits, src(ids).logits), path
