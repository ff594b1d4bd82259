"""Compiled list walks that run Python code meanwhile (issue 26, point 8).

TensorDirectory.values() and to_dict() of a decoded directory run in C
(tensors_fill and t_dict in src/kernels/numpy.pxi).  Code that runs while
they walk the directory's lists (a gc callback, started by an allocation; a
tensor made by Python) may shorten those lists: the walk must notice, never
read past their end.  Each case runs in a subprocess, so a crash fails the
test instead of the run.
"""

import subprocess
import sys
import textwrap

import kiln

SCRIPT = textwrap.dedent("""
    import gc, sys
    import numpy as np
    import kiln
    from kiln import _kernels_py
    kernels = _kernels_py if sys.argv[1] == "python" else __import__("kiln._kernels_c").\\
        _kernels_c
    ts = {"a%02d" % i: np.full(3, i, np.float32) for i in range(40)}
    ts["a05"] = np.zeros(0, np.float32)   # (no array straight from the row: Python makes it)
    buf = kiln.encode_tensors(ts)
    dec = kiln.Decoder(kiln.tensors, kernels=kernels)
    outcomes = set()
    for what in ("values", "to_dict"):
        for k in range(1, 40):
            for cut in ("clear", "shorten", "rows"):
                d = dec.decode(buf)
                seen = [0]

                def cb(phase, info, d=d, k=k, cut=cut):
                    if phase != "start":
                        return
                    seen[0] += 1
                    if seen[0] == k:
                        if cut == "clear":
                            d._tensors.clear(); d._rows.clear()
                        elif cut == "shorten":
                            del d._tensors[3:]
                        else:
                            del d._rows[2:]
                        d._errors = "x" * 50 + "strict"[:0]   # the old errors str freed

                gc.callbacks.append(cb)
                old = gc.get_threshold()
                gc.set_threshold(1)
                try:
                    r = getattr(d, what)()
                    outcomes.add("result")
                    n = len(r)
                except Exception as e:
                    outcomes.add(type(e).__name__)
                finally:
                    gc.set_threshold(*old)
                    gc.callbacks.remove(cb)
    print("DONE", sorted(outcomes))
""")


def run(impl):
    return subprocess.run([sys.executable, "-c", SCRIPT, impl], capture_output=True,
                          text=True, timeout=300)


def test_lists_shortened_while_the_directory_is_walked(impl):
    r = run(impl.name)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout.startswith("DONE"), r.stdout


def test_values_and_to_dict_unchanged(impl):
    import numpy as np
    ts = {"a": np.arange(3, dtype=np.float32), "z": np.zeros(0, np.int8),
          "é": np.ones((2, 2), np.float64)}
    d = impl.decode_tensors(impl.encode_tensors(ts))
    got = d.to_dict()
    assert list(got) == ["a", "z", "é"]
    assert got["a"].tolist() == [0.0, 1.0, 2.0] and got["z"].shape == (0,)
    assert got["é"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert [t.name for t in d.values()] == ["a", "z", "é"]
    assert isinstance(d.values()[0], kiln.Tensor)
