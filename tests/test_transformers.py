"""From a kiln set to a working transformers model (issue 49, item 4): a
model's ``save_pretrained`` set (safetensors shards, the tied ``lm_head``
stored once) converted with ``kiln convert``, a model built on the meta
device as transformers 5 builds them, ``kiln.torch.load_model(...,
assign=True)``, ``tie_weights()``: the logits equal those of
``from_pretrained`` of the safetensors set.  Tiny configs, no network.

Oracle: transformers' own ``from_pretrained`` of the same set."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested "
                                            "where it is")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel, cfg


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=96, max_position_embeddings=64,
                                   tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                   pad_token_id=0, torch_dtype="bfloat16")
    return transformers.LlamaForCausalLM, cfg


def materialize_buffers(model, device):
    """The buffers no checkpoint holds (``persistent=False``: LLaMA's rotary
    ``inv_freq``) are computed, not loaded: made on ``device`` and filled by
    transformers' own initialization of their module, as ``from_pretrained``
    does (docs/integrations.md shows the same lines)."""
    for module in model.modules():
        metas = [n for n, b in module.named_buffers(recurse=False) if b.is_meta]
        for n in metas:
            module.register_buffer(n, torch.empty_like(getattr(module, n), device=device),
                                   persistent=False)
        if metas:
            model._init_weights(module)


def _convert(src, dst):
    r = subprocess.run([sys.executable, "-m", "kiln", "convert", src, dst],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_a_kiln_set_loads_into_a_meta_built_model(make, tmp_path):
    cls, cfg = make()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if cls is transformers.LlamaForCausalLM else torch.float32
    src = cls(cfg).to(dtype).eval()
    st = tmp_path / "st"
    src.save_pretrained(st, max_shard_size="20KB")
    with open(st / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    assert "lm_head.weight" not in wm and len(set(wm.values())) > 1   # tied, stored once; a set
    ks = tmp_path / "kiln"
    _convert(str(st / "model.safetensors.index.json"), str(ks / "model.kiln.index.json"))

    with torch.device("meta"):   # as transformers builds models: nothing allocated
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    assert type(model) is cls
    assert model.lm_head.weight.is_meta
    assert kt.load_model(model, ks, assign=True, device="cpu") == ([], [])
    model.tie_weights()
    materialize_buffers(model, "cpu")
    model.eval()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert not any(t.is_meta for t in model.state_dict().values())
    assert not any(b.is_meta for b in model.buffers())

    ref = cls.from_pretrained(st, dtype=dtype).eval()
    ids = torch.tensor([[1, 5, 9, 17, 33, 2]])
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids).logits
    assert torch.equal(got, want)
    for k, v in src.state_dict().items():   # every weight is the one saved
        assert torch.equal(model.state_dict()[k], v), k


def test_a_gpt2_state_dict_is_stored_once_by_every_writer(tmp_path):
    cls, cfg = _gpt2()
    m = cls(cfg)
    sd = m.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()
    kt.save_file(sd, tmp_path / "one.kiln")
    kiln.save_sharded(sd, tmp_path / "plain", max_shard_size="20KB")
    kt.save_sharded(sd, tmp_path / "set", max_shard_size="20KB")
    kt.save_model(m, tmp_path / "model.kiln")
    one = os.path.getsize(tmp_path / "one.kiln")
    with kiln.open(tmp_path / "one.kiln") as f:
        payload = sum(t.nbytes for t in f.values())
    for folder in ("plain", "set"):
        with open(tmp_path / folder / "model.kiln.index.json") as f:
            assert json.load(f)["metadata"]["total_size"] == payload
    with kiln.open(tmp_path / "model.kiln") as f:
        assert "transformer.wte.weight" in f.keys() and "lm_head.weight" not in f.keys()
    assert os.path.getsize(tmp_path / "model.kiln") == one
    for where in ("one.kiln", "plain", "set", "model.kiln"):
        back = kt.load_file(tmp_path / where)
        assert back["lm_head.weight"] is back["transformer.wte.weight"], where
        fresh = cls(cfg)
        assert kt.load_model(fresh, tmp_path / where) == ([], []), where
        for k, v in sd.items():
            assert torch.equal(fresh.state_dict()[k], v), (where, k)
