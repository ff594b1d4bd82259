"""kiln.torch mistakes mypy --strict reports, one per line marked E (tests/test_torch.py)."""
import torch

import kiln.torch

x: int = kiln.torch.load_file("m.kiln")  # E: a state dict, not an int
y: str = kiln.torch.load_model(torch.nn.Linear(1, 1), "m.kiln")  # E: IncompatibleKeys
kiln.torch.save_file({"w": torch.ones(1)}, 3)  # E: a path, not an int
kiln.torch.load_model(torch.nn.Linear(1, 1), "m.kiln", strict="yes")  # E: strict is a bool
