"""A tied twin the model has not tied yet (issue 60 item 7): a transformers
model whose head is a separate parameter until ``tie_weights()`` (as
accelerate's ``init_empty_weights`` leaves it) meets a file that stores the
embedding only (as ``save_pretrained`` does); ``load_model`` says which name
is tied to which and to call ``tie_weights()``; after it, the load works.
Real transformers GPT-2; both kernels (``api``)."""

import pytest

import kiln


@pytest.fixture
def gpt2():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8,
                                  bos_token_id=0, eos_token_id=0)
    return torch, transformers.GPT2LMHeadModel, cfg


def test_an_untied_twin_is_named_with_tie_weights(api, gpt2, tmp_path):
    import kiln.torch
    torch, Model, cfg = gpt2
    src = Model(cfg)
    path = str(tmp_path / "g.kiln")
    kiln.torch.save_file({k: v.detach().clone() for k, v in src.state_dict().items()
                          if k != "lm_head.weight"}, path)   # the head stored once, as wte
    with torch.device("meta"):
        m = Model(cfg)
    m.lm_head.weight = torch.nn.Parameter(torch.empty(16, 8, device="meta"))   # untied
    with pytest.raises(kiln.torch.LoadError) as e:
        kiln.torch.load_model(m, path, assign=True)
    assert e.value.missing_keys == ["lm_head.weight"]
    msg = str(e.value)
    assert "lm_head.weight is tied to transformer.wte.weight" in msg and "tie_weights()" in msg
    m.tie_weights()
    assert kiln.torch.load_model(m, path, assign=True) == ([], [])
    assert m.lm_head.weight is m.transformer.wte.weight
    assert torch.equal(m.lm_head.weight, src.transformer.wte.weight)
    # a plain missing name gets no such note
    other = torch.nn.Linear(2, 2)
    kiln.torch.save_file({"weight": torch.ones(2, 2)}, str(tmp_path / "l.kiln"))
    with pytest.raises(kiln.torch.LoadError) as e:
        kiln.torch.load_model(other, str(tmp_path / "l.kiln"))
    assert "tie_weights" not in str(e.value)
