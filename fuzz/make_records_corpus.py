"""Write the seed inputs of fuzz_records.py into fuzz/corpus/records/
(run from the repository root: python fuzz/make_records_corpus.py)."""
import io
import os
import sys

import numpy as np

import kiln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records_oracle as O  # noqa: E402

VALUES = {0: [{"id": i, "name": "n" * i} for i in range(3)],
          1: [{"id": i, "name": "x", "img": {"a": np.arange(i + 1, dtype=np.float32)}}
              for i in range(2)],
          2: [b"", b"abc", bytes(range(40))],
          3: [{"a": 1, "b": True, "tags": ["p", "q"]}, {"a": -2, "b": False, "tags": []}]}


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "records")
    os.makedirs(out_dir, exist_ok=True)
    for k, vs in VALUES.items():
        out = io.BytesIO()
        with kiln.RecordWriter(out, O.TYPES[k]) as w:
            for v in vs:
                w.write(v)
        full = out.getvalue()
        for cut in (None, -41, -7, 30):
            data = full if cut is None else full[:cut]
            for flags in (0, 4):
                seed = bytes([k | flags]) + data
                O.check_records_input(seed)
                name = "seed-%d-%s-%d" % (k, "full" if cut is None else "cut%d" % cut, flags)
                with open(os.path.join(out_dir, name), "wb") as f:
                    f.write(seed)


if __name__ == "__main__":
    main()
