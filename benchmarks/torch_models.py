"""Hugging Face-like models for ``python -m benchmarks.torch_checkpoint``
(issue 49): a GPT-2-like model (f32, ``lm_head`` tied to ``wte``) and a
LLaMA-like bf16 model, each saved and loaded by kiln.torch, safetensors.torch
and transformers, side by side in one process, page cache warm:

* ``save_model``: ``kiln.torch.save_model`` against
  ``safetensors.torch.save_model`` (each stores the tied weight once);
* ``save set``: ``kiln.torch.save_sharded(model.state_dict(), ...)`` against
  ``save_pretrained(..., max_shard_size)`` (a set of about 4 shards);
* ``load_file``: the state dict of each one-file checkpoint (CPU tensors over
  a mapping, nothing read);
* ``load_model``: filling the built model from each one-file checkpoint;
* ``load_model (set)``: the same from each set (transformers'
  ``load_sharded_checkpoint`` for the safetensors set);
* ``meta load``: ``kiln.torch.load_model(meta_model, path, assign=True)``
  (a model built under ``torch.device("meta")`` before each call, untimed)
  against ``kiln.torch.load_model`` into the built model;
* ``from_pretrained``: ``from_pretrained`` of the safetensors set against
  what a kiln user types for it: build under meta, ``load_model(..., set,
  assign=True)``, ``tie_weights()`` (and LLaMA's rotary buffers, computed,
  made on the CPU).

Targets: every kiln row at most 1.0x its peer, the meta load at most 1.1x
``load_model`` into the built model, judged on the ratio of medians.
"""

import contextlib
import io
import os
import tempfile

import kiln

from benchmarks.torch_checkpoint import _table, _verdicts

BASE = {"save_model": "safetensors.torch.save_model",
        "save set": "save_pretrained (sharded)",
        "load_file": "safetensors.torch.load_file",
        "load_model": "safetensors.torch.load_model",
        "load_model (set)": "load_sharded_checkpoint",
        "meta load": "kiln load_model (built model)",
        "from_pretrained": "from_pretrained (set)"}
KILN = {"save_model": "kiln.torch.save_model", "save set": "kiln.torch.save_sharded",
        "load_file": "kiln.torch.load_file", "load_model": "kiln.torch.load_model",
        "load_model (set)": "kiln.torch.load_model (set)",
        "meta load": "kiln load_model(meta, assign=True)",
        "from_pretrained": "kiln: meta + load_model + tie"}
TARGETS = {op: (1.1 if op == "meta load" else 1.0) for op in BASE}


def _config(transformers, name, layers):
    """(config, dtype): GPT-2's widths and vocabulary (124M at 12 layers), or
    a LLaMA-like model of 1024 wide (the vocabulary of LLaMA 2)."""
    if name == "gpt2":
        return transformers.GPT2Config(n_layer=layers), "float32"
    if name == "llama":
        return transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816,
                                        num_hidden_layers=layers, num_attention_heads=16,
                                        num_key_value_heads=4, vocab_size=32000,
                                        tie_word_embeddings=False), "bfloat16"
    raise SystemExit("--models: unknown model %r (gpt2, llama)" % name)


def _quiet(fn):
    """fn with transformers' progress bars and notes kept off the report."""
    def call(*a, **kw):
        with contextlib.redirect_stderr(io.StringIO()):
            return fn(*a, **kw)
    return call


def model_section(torch, transformers, name, layers, repeat):
    import safetensors.torch as sttorch
    from transformers.trainer_utils import load_sharded_checkpoint
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    kt = kiln.torch
    cfg, dname = _config(transformers, name, layers)
    dtype = getattr(torch, dname)
    auto = transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    src = auto.from_config(cfg, dtype=dtype).eval()
    built = auto.from_config(cfg, dtype=dtype).eval()   # the model filled in place
    total = sum(v.numel() * v.element_size() for v in _stored(torch, src))
    shard = "%dMB" % max(1, total // 4 // 10**6)

    def meta():
        with torch.device("meta"):
            return auto.from_config(cfg, dtype=dtype)

    def kiln_pretrained(folder):
        m = meta()
        kt.load_model(m, folder, assign=True)
        m.tie_weights()
        rotary = getattr(m.model, "rotary_emb", None) if hasattr(m, "model") else None
        if rotary is not None:   # computed in __init__, in no checkpoint
            m.model.rotary_emb = type(rotary)(m.config)
        return m.eval()

    with tempfile.TemporaryDirectory() as folder:
        sp, kp = os.path.join(folder, "m.safetensors"), os.path.join(folder, "m.kiln")
        st_set, k_set = os.path.join(folder, "st"), os.path.join(folder, "kiln")
        sttorch.save_model(src, sp)
        kt.save_model(src, kp)
        _quiet(src.save_pretrained)(st_set, max_shard_size=shard)
        kt.save_sharded(src.state_dict(), k_set, max_shard_size=shard)
        shards = len(kiln.open(k_set).shards)
        print("\n%s-like, %d layers, %s: %.0f MiB stored (tied weights once), sets of %d "
              "shards; transformers %s" % (name, layers, dname, total / 2**20, shards,
                                           transformers.__version__))
        sd = src.state_dict()
        rows = [
            ("save_model", BASE["save_model"], lambda: sttorch.save_model(src, sp)),
            ("save_model", KILN["save_model"], lambda: kt.save_model(src, kp)),
            ("save set", BASE["save set"],
             _quiet(lambda: src.save_pretrained(st_set, max_shard_size=shard))),
            ("save set", KILN["save set"],
             lambda: kt.save_sharded(sd, k_set, max_shard_size=shard)),
            ("load_file", BASE["load_file"], lambda: sttorch.load_file(sp)),
            ("load_file", KILN["load_file"], lambda: kt.load_file(kp)),
            ("load_model", BASE["load_model"], lambda: sttorch.load_model(built, sp)),
            ("load_model", KILN["load_model"], lambda: kt.load_model(built, kp)),
            ("load_model (set)", BASE["load_model (set)"],
             _quiet(lambda: load_sharded_checkpoint(built, st_set, strict=False))),
            ("load_model (set)", KILN["load_model (set)"], lambda: kt.load_model(built, k_set)),
            ("meta load", BASE["meta load"], lambda: kt.load_model(built, kp)),
            ("meta load", KILN["meta load"], (meta, lambda m: kt.load_model(m, kp, assign=True))),
            ("from_pretrained", BASE["from_pretrained"],
             _quiet(lambda: auto.from_pretrained(st_set, dtype=dtype))),
            ("from_pretrained", KILN["from_pretrained"], lambda: kiln_pretrained(k_set)),
        ]
        timed = _table(rows, repeat, total, BASE)
        _verdicts(timed, TARGETS, BASE, KILN)


def _stored(torch, model):
    """The model's tensors, each stored tensor once (tied names counted once)."""
    seen = {}
    for v in model.state_dict().values():
        seen[(v.data_ptr(), tuple(v.shape), v.dtype)] = v
    return list(seen.values())
