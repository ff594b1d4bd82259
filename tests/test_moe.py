"""A mixture-of-experts checkpoint end to end (issue 57 item 5).

A tiny Qwen3-MoE (4 layers of 128 experts, every width a few elements) is
saved by ``save_pretrained``.  transformers 5 keeps the experts fused inside
the model (``mlp.experts.gate_up_proj``) and writes the Hub's per-expert
names when it saves: 1,575 tensors with 71 KB of names, past the 64 KiB that
the 16-bit name fields of one directory reach, so the converted file is a
wide one (spec/kiln-v2.md).  Both forms are checked:

- the Hub-format file converted to kiln and back to safetensors, each
  tensor bit for bit against ``safetensors.torch.load_file`` of the original
  (the oracle), and ``from_pretrained`` of the round-tripped folder computing
  what the original folder's model computes;
- the in-model names (``save_original_format=False``) converted and loaded
  into a model built on the meta device with ``assign=True``, its logits
  those of ``from_pretrained`` of the Hub-format folder.

No network: a config only, weights from a seeded generator."""

import os
import shutil

import pytest

import kiln
from kiln import _wire as W
from kiln.cli import main as kiln_main

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested "
                                            "where it is")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: "
                                                          "the Hugging Face path is tested "
                                                          "where it is")
import kiln.torch as kt  # noqa: E402
import safetensors.torch as st  # noqa: E402


def _config():
    return transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        num_experts=128, num_experts_per_tok=2, max_position_embeddings=32,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)


def _build(meta=False):
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(_config())
    return transformers.AutoModelForCausalLM.from_config(_config()).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The model, and the folders save_pretrained wrote in both forms."""
    root = tmp_path_factory.mktemp("moe")
    src = _build()
    src.save_pretrained(root / "hub")
    src.save_pretrained(root / "fused", save_original_format=False)
    return src, root


def _convert(src, dst):
    assert kiln_main(["convert", str(src), str(dst)]) == 0


def _flags(path):
    with open(path, "rb") as f:
        return f.read(W.HEADER_SIZE)[W.H_FLAGS]


def _logits(model):
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(ids).logits


def _remake_rotary(model):
    """The rotary inv_freq buffer is computed, never saved: made again on the CPU."""
    rotary = model.model.rotary_emb
    with torch.device("cpu"):
        model.model.rotary_emb = type(rotary)(model.config)


def test_the_hub_format_file_converts_both_ways_bit_exact(api, saved, tmp_path):
    src, root = saved
    hub = root / "hub" / "model.safetensors"
    want = st.load_file(hub)
    assert len(want) > 1500
    assert sum(len(k.encode()) for k in want) > W.U16_MAX   # past one narrow directory

    _convert(hub, tmp_path / "m.kiln")
    assert _flags(tmp_path / "m.kiln") & W.FLAG_WIDE
    assert kiln_main(["check", str(tmp_path / "m.kiln")]) == 0
    with kiln.open(tmp_path / "m.kiln") as f:
        assert sorted(f.keys()) == sorted(want)
    got = kt.load_file(tmp_path / "m.kiln")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k

    back = tmp_path / "back"
    back.mkdir()
    for name in ("config.json", "generation_config.json"):
        if (root / "hub" / name).exists():
            shutil.copy(root / "hub" / name, back / name)
    _convert(tmp_path / "m.kiln", back / "model.safetensors")
    again = st.load_file(back / "model.safetensors")
    assert sorted(again) == sorted(want)
    for k, v in want.items():
        assert again[k].dtype == v.dtype and torch.equal(again[k], v), k

    ref = transformers.AutoModelForCausalLM.from_pretrained(root / "hub")
    rt = transformers.AutoModelForCausalLM.from_pretrained(back)
    torch.testing.assert_close(_logits(rt), _logits(ref))
    torch.testing.assert_close(_logits(ref), _logits(src))


def test_the_in_model_names_load_into_a_meta_model(api, saved, tmp_path):
    src, root = saved
    fused = os.path.join(root, "fused", "model.safetensors")
    _convert(fused, tmp_path / "f.kiln")
    m = _build(meta=True)
    assert all(t.is_meta for t in m.state_dict().values())
    assert kt.load_model(m, tmp_path / "f.kiln", assign=True) == ([], [])
    _remake_rotary(m)
    assert not [n for n, t in m.state_dict().items() if t.is_meta]
    for k, v in src.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
    ref = transformers.AutoModelForCausalLM.from_pretrained(root / "hub")
    torch.testing.assert_close(_logits(m), _logits(ref))


def test_a_state_dict_of_the_hub_names_saves_to_one_file(api, saved, tmp_path):
    """kiln.torch.save_file writes what safetensors.torch.save_file writes: the
    Hub-format state dict to one file, read back by every loader."""
    src, root = saved
    sd = st.load_file(root / "hub" / "model.safetensors")
    kt.save_file(sd, tmp_path / "s.kiln")
    assert _flags(tmp_path / "s.kiln") & W.FLAG_WIDE
    got = kt.load_file(tmp_path / "s.kiln")
    for k, v in sd.items():
        assert torch.equal(got[k], v), k
    holder = torch.nn.Module()
    holder.p = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(torch.empty_like(v))
                                      for k, v in sd.items()})
    kt.save_file({"p." + k.replace(".", "_"): v for k, v in sd.items()}, tmp_path / "p.kiln")
    assert kt.load_model(holder, tmp_path / "p.kiln") == ([], [])
    for k, v in sd.items():
        assert torch.equal(holder.p[k.replace(".", "_")], v), k
