"""Sets split where they must (issue 57 item 2): ``save_sharded`` cuts shards
by payload bytes and never cuts one a file cannot hold, and a save or a
``kiln convert`` into a set that fails leaves the old set or nothing (no
empty or partial folder).  The failures are real: a child process whose
file-size limit (RLIMIT_FSIZE) stops its second shard with EFBIG."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _wire as W
from kiln._files.shardsave import split
from _util import st_i32_file

MiB = 1 << 20


def test_split_cuts_by_bytes_count_and_name_heap():
    # hand-written: (sizes, cap, heaps, max_tensors, max_heap) -> groups
    assert split([4, 4, 4], 8) == [[0, 1], [2]]
    assert split([4, 4, 4], 100, [1, 1, 1], max_tensors=2) == [[0, 1], [2]]
    assert split([1, 1, 1, 1], 100, [5, 5, 5, 1], max_heap=10) == [[0, 1], [2, 3]]
    assert split([50, 1, 1], 10, [1, 1, 1]) == [[0], [1, 2]]   # a big tensor alone
    assert split([], 10, []) == [[]]
    with pytest.raises(kiln.EncodeError) as e:
        split([1, 1], 100, [3, 11], max_heap=10)
    assert e.value.code == "LIMIT" and "tensor 1" in e.value.reason


def test_6144_expert_tensors_save_as_one_set_by_default(api, tmp_path):
    # issue 57: 48 x 128 names of about 47 bytes, 5 GB shards (the default):
    # once a LIMIT on u16 name offsets that left an empty folder behind
    names = ["model.layers.%d.mlp.experts.%d.down_proj.weight" % (i // 128, i % 128)
             for i in range(48 * 128)]
    tensors = {n: np.full(2, i, np.int16) for i, n in enumerate(names)}
    index = kiln.save_sharded(tensors, tmp_path / "set")
    with open(index) as f:
        wm = json.load(f)["weight_map"]
    assert sorted(wm) == sorted(names) and set(wm.values()) == {"model-00001-of-00001.kiln"}
    with open(tmp_path / "set" / "model-00001-of-00001.kiln", "rb") as f:
        assert f.read(8)[W.H_FLAGS] & W.FLAG_WIDE
    with kiln.open(str(tmp_path / "set")) as f:
        assert sorted(f.keys()) == sorted(names)
        for i in (0, 777, 6143):
            assert f[names[i]].numpy().tolist() == [i, i]


CHILD = r"""
import resource, signal, sys
import numpy as np
import kiln
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG as an OSError, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
what, dst = sys.argv[1], sys.argv[2]
try:
    if what == "save":
        kiln.save_sharded({"a": np.ones(25000, np.float32), "b": np.ones(600000, np.float32)},
                          dst, max_shard_size="200kB")
    else:
        from kiln.convert import convert
        convert(sys.argv[3], dst)
except OSError as e:
    print("OSError", e.errno)
    sys.exit(3)
print("saved")
"""


def _child(impl, *args):
    env = dict(os.environ)
    env["KILN_PUREPYTHON"] = "1" if impl.name == "python" else "0"
    r = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True,
                       text=True, timeout=120, env=env)
    return r.returncode, r.stdout.strip(), r.stderr


def _tree(folder):
    out = {}
    for dirpath, _, files in os.walk(folder):
        for fn in files:
            with open(os.path.join(dirpath, fn), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, fn), folder)] = f.read()
    return out


def test_a_failed_save_leaves_no_folder(impl, tmp_path):
    dst = tmp_path / "new" / "deeper" / "set"
    rc, out, err = _child(impl, "save", dst)
    assert (rc, out) == (3, "OSError 27"), err   # EFBIG on the 2.4 MB second shard
    assert os.listdir(tmp_path) == []            # not "new", not "new/deeper/set"


def test_a_failed_save_over_a_set_leaves_the_old_set(impl, tmp_path):
    dst = tmp_path / "set"
    kiln.save_sharded({"old": np.arange(10, dtype=np.int8)}, dst)
    before = _tree(dst)
    (tmp_path / "keep.txt").write_text("mine")
    rc, out, err = _child(impl, "save", dst)
    assert (rc, out) == (3, "OSError 27"), err
    assert _tree(dst) == before
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "set"]


def _st_set(folder, shards):
    """A safetensors set written by hand: shards of {name: i32 array}."""
    os.makedirs(folder)
    wm = {}
    for k, tensors in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        st_i32_file(os.path.join(folder, fn), tensors)
        wm.update(dict.fromkeys(tensors, fn))
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    return index


def test_a_failed_convert_into_a_set_leaves_no_folder(impl, tmp_path):
    src = _st_set(tmp_path / "src", [{"a": np.ones(1000, np.int32)},
                                     {"b": np.ones(400000, np.int32)}])   # 1.6 MB
    dst = tmp_path / "out" / "model.kiln.index.json"
    rc, out, err = _child(impl, "convert", dst, src)
    assert (rc, out) == (3, "OSError 27"), err
    assert sorted(os.listdir(tmp_path)) == ["src"]
    # and the same conversion without the limit writes the whole set
    from kiln.convert import convert
    assert convert(str(src), str(dst)) == 2
    with kiln.open(str(dst)) as f:
        assert f["b"].numpy().sum() == 400000
