"""Typical kiln.torch user code: mypy --strict accepts it (tests/test_torch.py)."""
from typing import Dict, List

import torch

import kiln
import kiln.torch


def main(folder: str) -> None:
    model = torch.nn.Linear(4, 2)
    kiln.torch.save_file(model.state_dict(), folder + "/m.kiln", metadata={"step": 3})
    sd: Dict[str, torch.Tensor] = kiln.torch.load_file(folder + "/m.kiln")
    w: torch.Tensor = sd["weight"]
    got = kiln.torch.load_model(model, folder + "/m.kiln", strict=False)
    missing: List[str] = got.missing_keys
    try:
        kiln.torch.load_model(torch.nn.Linear(3, 2), folder + "/m.kiln")
    except kiln.torch.LoadError as e:
        print(e.missing_keys, e.unexpected_keys, e.mismatched)
    print(w.shape, missing, got.unexpected_keys)
