"""A set saved over and over into one folder while readers hold earlier
generations of it (issue 56 item 4): a shard name once used is never given to
a later generation's shard, so a reader of an old index (its shards opened by
name, on first use) reads its own generation or meets FileNotFoundError,
never another generation's bytes.  Both kernels.

Oracles: hand-written values (every tensor of generation g is filled with g)
and real second processes doing the saves."""

import os
import subprocess
import sys
import textwrap

import numpy as np

import kiln

_NAMES = ("a", "b", "c")


def _gen(g):
    """Generation ``g`` of the set: three tensors of 1,000 f32 each, all ``g``."""
    return {n: np.full(1000, float(g), np.float32) for n in _NAMES}


_SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    folder, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for g in range(first, last + 1):
        kiln.save_sharded({n: np.full(1000, float(g), np.float32) for n in "abc"}, folder,
                          max_shard_size=4000)
""")


def _save_in_child(folder, first, last):
    r = subprocess.run([sys.executable, "-c", _SAVER, str(folder), str(first), str(last)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _read_or_gone(f, name):
    """f[name]'s first value, or "gone" where its shard was removed (the one
    error an old generation's reader may meet)."""
    try:
        return float(f[name].numpy()[0])
    except FileNotFoundError:
        return "gone"


def test_a_reader_of_the_first_set_never_reads_the_third(api, tmp_path):
    kiln.save_sharded(_gen(1), tmp_path, max_shard_size=4000)   # one tensor a shard
    with kiln.open(tmp_path) as f:
        assert f.shards == ["model-0000%d-of-00003.kiln" % i for i in (1, 2, 3)]
        assert f["a"].numpy()[0] == 1.0   # the first shard open, the others not yet
        _save_in_child(tmp_path, 2, 3)    # two more generations, by another process
        got = [_read_or_gone(f, n) for n in _NAMES]
    assert got[0] == 1.0                      # its own open shard: its own bytes
    assert got[1:] == ["gone", "gone"], got   # never 3.0 (the third set under the old names)
    with kiln.open(tmp_path) as f:            # a new reader: the third set, whole
        assert [float(f[n].numpy()[0]) for n in _NAMES] == [3.0, 3.0, 3.0]
        assert not set(f.shards) & {"model-0000%d-of-00003.kiln" % i for i in (1, 2, 3)}


def test_no_shard_name_repeats_across_many_saves(api, tmp_path):
    seen = set()
    for g in range(1, 7):
        kiln.save_sharded(_gen(g), tmp_path, max_shard_size=4000)
        with kiln.open(tmp_path) as f:
            names = set(f.shards)
            assert [float(f[n].numpy()[0]) for n in _NAMES] == [float(g)] * 3
        assert not names & seen, (g, names & seen)
        assert sorted(os.listdir(tmp_path)) == sorted(names | {"model.kiln.index.json"})
        seen |= names


_LOOP = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    folder, n = sys.argv[1], int(sys.argv[2])
    for g in range(2, n + 2):
        kiln.save_sharded({k: np.full(1000, float(g), np.float32) for k in "abc"}, folder,
                          max_shard_size=4000)
    print("saved", n)
""")


def test_readers_racing_a_process_that_saves_over_and_over(api, tmp_path):
    """Real interleaving: a child saves 40 generations while this process opens
    the set again and again and reads every tensor; each read that succeeds
    gives one generation (all three values equal), never a mix."""
    kiln.save_sharded(_gen(1), tmp_path, max_shard_size=4000)
    child = subprocess.Popen([sys.executable, "-c", _LOOP, str(tmp_path), "40"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    whole = gone = 0
    try:
        while child.poll() is None:
            try:
                with kiln.open(tmp_path) as f:
                    got = [_read_or_gone(f, n) for n in _NAMES]
            except FileNotFoundError:   # the index itself between a rename and our open
                gone += 1
                continue
            values = [v for v in got if v != "gone"]
            assert len(set(values)) <= 1, "a mix of generations: %r" % (got,)
            if len(values) == 3:
                whole += 1
            else:
                gone += 1
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and out.strip() == "saved 40", err
    assert whole >= 1
    with kiln.open(tmp_path) as f:
        assert [float(f[n].numpy()[0]) for n in _NAMES] == [41.0] * 3
