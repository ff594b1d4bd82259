"""What ``import kiln`` loads, proved in fresh interpreters (issue 31).

``import kiln`` and a records round trip load the records and tensors core
only: no ml_dtypes (until a tensor of its dtypes becomes an array), no pure
kernel on the compiled path, none of the optional parts (files, schemas,
converters, remote reads, Dask, the command line) and none of the optional
packages.  Every ``kiln.name`` still works, loading its part on first use.
Each child runs on the kernel ``impl`` names and says which it ran.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _compat

from _util import ROOT

OPTIONAL_PARTS = ("kiln.files", "kiln.schema", "kiln.convert", "kiln.remote", "kiln.dask",
                  "kiln.cli", "kiln._meta", "kiln._rows", "kiln._files", "kiln._cli",
                  "kiln._access")
OPTIONAL_PACKAGES = ("ml_dtypes", "fsspec", "jsonschema", "dask", "distributed", "safetensors",
                     "gguf", "msgspec")

PRELUDE = r"""
import sys
def loaded(prefixes):
    return sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in prefixes))
def report(d):
    import json   # (only now: the command line's own imports are under test)
    print(json.dumps(d))
"""


def _child(impl, body):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("KILN_PUREPYTHON", None)
    if impl.name == "python":
        env["KILN_PUREPYTHON"] = "1"
    r = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("impl") == impl.name
    return out


def _watched(impl):
    names = list(OPTIONAL_PARTS + OPTIONAL_PACKAGES)
    if impl.name == "cython" and not _compat.FREE_THREADED_BUILD:
        # (a free-threaded build serves the tensor objects with the pure kernel's
        # tensor part, as kiln._compat declares)
        names.append("kiln._kernels_py")
    return names


def test_import_kiln_and_a_records_round_trip_load_only_the_core(impl):
    watched = _watched(impl)
    out = _child(impl, r"""
import kiln
after_import = loaded(%r)
t = kiln.parse_type("struct{id:i64,name:str,xs:list<f64>,tags:list<i32>,t:tensors,}")
value = {"id": 7, "name": "r\u00e9cord", "xs": [1.5, -2.0], "tags": [1, 2, 3],
         "t": {"w": __import__("numpy").arange(6, dtype="float32").reshape(2, 3)}}
back = kiln.decode(kiln.encode(value, t), t)
arr = back["t"]["w"].numpy()
assert back["id"] == 7 and back["name"] == "r\u00e9cord" and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
report(({"impl": kiln.IMPLEMENTATION, "import": after_import,
                  "round trip": loaded(%r)}))
""" % (watched, watched))
    assert out == {"import": [], "round trip": []}


def test_each_kernel_loads_only_itself_for_tensors_built_by_hand(impl):
    """Tensors and directories built by hand (construction checks, links),
    their arrays, pickles, DLPack and a decode: on the compiled path no module
    of the pure kernel is imported, and with the fallback nothing compiled."""
    out = _child(impl, r"""
import pickle
import numpy as np
import kiln
w = kiln.Tensor(bytes(8), dtype="u4", shape=(4, 4), name="w", quant_scheme=1, quant_axis=1,
                group_size=2, scale_index="s")
s = kiln.Tensor.from_numpy(np.ones((4, 2), np.float32), name="s")
b = kiln.Tensor(bytes([1, 0, 1]), dtype="bool", shape=(3,), name="b")
d = kiln.TensorDirectory([w, s, b])
back = pickle.loads(pickle.dumps(d, protocol=5))
assert back == d and np.from_dlpack(s).tolist() == [[1.0, 1.0]] * 4
assert s.__dlpack__(max_version=(1, 0)) is not None and d["b"].numpy().tolist() == [True, False, True]
e = kiln.decode_tensors(kiln.encode_tensors(d))
assert e.to_dict()["s"].sum() == 8 and [t.name for t in e.values()] == ["w", "s", "b"]
compiled = sorted(m for m, mod in list(sys.modules.items()) if m.startswith("kiln")
                  and str(getattr(mod, "__file__", "")).endswith((".so", ".pyd")))
report({"impl": kiln.IMPLEMENTATION, "pure": loaded(["kiln._kernels_py"]), "compiled": compiled,
        "bound": kiln._tensors.BOUND.part.__name__})
""")
    if impl.name == "cython" and _compat.FREE_THREADED_BUILD:   # declared in kiln._compat
        assert out["compiled"] == ["kiln._kernels_c"] and out["bound"] == "kiln._kernels_py"
    elif impl.name == "cython":
        assert out == {"pure": [], "compiled": ["kiln._kernels_c"], "bound": "kiln._kernels_c"}
    else:
        assert out["compiled"] == [] and out["bound"] == "kiln._kernels_py"


def test_ml_dtypes_loads_when_one_of_its_tensors_becomes_an_array(impl):
    pytest.importorskip("ml_dtypes")
    out = _child(impl, r"""
import kiln
bits = bytes.fromhex("803fc0bf")            # bf16 1.0, -1.5
buf = kiln.encode_tensors([kiln.Tensor(bits, dtype="bf16", shape=(2,)),
                           kiln.Tensor(b"\x3c\x40", dtype="f8e5m2", shape=(2,))])
d = kiln.decode_tensors(buf)
before = "ml_dtypes" in sys.modules
first = [d[0].numpy(), d[1].numpy()]        # the first arrays import ml_dtypes
again = [t.numpy() for t in kiln.decode_tensors(buf).values()]   # and later ones use it
import ml_dtypes
x = ml_dtypes.bfloat16
report(({"impl": kiln.IMPLEMENTATION, "before": before,
                  "dtypes": [str(a.dtype) for a in first + again],
                  "values": [a.astype("float32").tolist() for a in first + again],
                  "bases": [type(a.base).__name__ for a in again],
                  "encoded": kiln.encode_tensors([first[0], first[1]]) == buf,
                  "code": kiln.Tensor.from_numpy(first[0]).dtype}))
""")
    assert out["before"] is False
    assert out["dtypes"] == ["bfloat16", "float8_e5m2"] * 2
    assert out["values"] == [[1.0, -1.5], [1.0, 2.0]] * 2
    assert out["encoded"] is True and out["code"] == "bf16"
    # f8e5m2 (a numpy kind "f" type) then takes the compiled Tensor.numpy, handed
    # the new dtypes when ml_dtypes came in; bf16 (kind "V") stays on the Python path
    # (the Python path's arrays are views of their directory's one owner array)
    # the pure kernel's directory: views of its one owner array; the compiled
    # kernel's: the held buffer, or its memoryview on the Python path
    want = ["memoryview", "HeldBuffer"] if impl.name == "cython" else ["ndarray", "ndarray"]
    assert out["bases"] == want


def test_without_ml_dtypes_numpy_refuses_and_bits_gives_the_raw_bits(impl):
    # sys.modules["ml_dtypes"] = None: "import ml_dtypes" raises ImportError, as
    # when it is not installed.  numpy() of a bf16/float8 tensor must not hand
    # out unsigned integers that look like numbers: it says what to install;
    # bits() is the explicit way to the raw bit patterns.
    out = _child(impl, r"""
sys.modules["ml_dtypes"] = None
import kiln
d = kiln.decode_tensors(kiln.encode_tensors({"w": kiln.Tensor(b"\x80\x3f", dtype="bf16", shape=(1,)),
                                             "v": kiln.Tensor(b"\x3c", dtype="f8e4m3", shape=(1,)),
                                             "e": kiln.Tensor(b"\x7f", dtype="e8m0", shape=(1,))}))
hand = kiln.Tensor(b"\x80\x3f", dtype="bf16", shape=(1,))
refused = []
for what, call in [("w", lambda: d["w"].numpy()), ("v", lambda: d["v"].numpy()),
                   ("e", lambda: d["e"].numpy()), ("hand", hand.numpy),
                   ("dict", d.to_dict), ("asarray", lambda: __import__("numpy").asarray(hand)),
                   ("code", lambda: kiln.numpy_dtype(4))]:
    try:
        call()
        refused.append([what, None])
    except ImportError as e:
        refused.append([what, "kiln-wire[ml]" in str(e) and "bits()" in str(e)])
bits = [d["w"].bits(), d["v"].bits(), d["e"].bits(), hand.bits()]
report(({"impl": kiln.IMPLEMENTATION, "refused": refused,
         "dtypes": [str(a.dtype) for a in bits], "values": [a.tolist() for a in bits],
         "f32": str(kiln.numpy_dtype(2))}))
""")
    assert out == {"refused": [["w", True], ["v", True], ["e", True], ["hand", True],
                               ["dict", True], ["asarray", True], ["code", True]],
                   "dtypes": ["uint16", "uint8", "uint8", "uint16"],
                   "values": [[0x3F80], [0x3C], [0x7F], [0x3F80]], "f32": "float32"}


def test_with_ml_dtypes_bits_and_numpy_agree(impl):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    d = impl.decode_tensors(impl.encode_tensors(
        {"w": kiln.Tensor(b"\x80\x3f\x00\xc0", dtype="bf16", shape=(2,))}))
    assert d["w"].numpy().dtype == np.dtype(ml_dtypes.bfloat16)
    assert d["w"].numpy().astype(np.float32).tolist() == [1.0, -2.0]
    assert d["w"].bits().dtype == np.dtype("<u2") and d["w"].bits().tolist() == [0x3F80, 0xC000]


def test_every_public_name_works_and_loads_its_part_on_first_use(impl):
    out = _child(impl, r"""
import kiln
seen = {}
for name in kiln.__all__:
    before = set(sys.modules)
    getattr(kiln, name)
    seen[name] = sorted(m for m in set(sys.modules) - before if m.startswith("kiln."))
mods = {}
for name in ("files", "schema", "remote", "convert", "cli", "dask", "records"):
    try:
        mods[name] = getattr(kiln, name).__name__
    except ImportError as e:   # kiln.dask without dask and distributed
        mods[name] = "ImportError: %s" % e
report(({"impl": kiln.IMPLEMENTATION, "seen": seen, "mods": mods,
                  "dir": sorted(set(kiln.__all__) - set(dir(kiln))),
                  "open is files.open": kiln.open is kiln.files.open}))
""")
    assert "kiln.files" in out["seen"]["save_tensors"]     # the first name of each part
    assert "kiln.schema" in out["seen"]["SchemaError"]
    assert "kiln.records" in out["seen"]["RecordWriter"]
    # kiln.files' writers and sets load their own modules on first use (reading a
    # file needs none),
    # and kiln.Record and the annotation aliases theirs (with numpy.typing)
    assert "kiln._files.save" in out["seen"]["save_tensors"]
    assert {k: v for k, v in out["seen"].items() if v} == {
        "save_tensors": out["seen"]["save_tensors"], "SchemaError": out["seen"]["SchemaError"],
        "RecordWriter": out["seen"]["RecordWriter"], "TensorWriter": ["kiln._files.writer"],
        "save_sharded": ["kiln._files.sharded", "kiln._files.shardsave", "kiln._files.tied"],
        "I8": ["kiln._aliases"], "Record": ["kiln._record"]}
    no_dask = [p for p in ("dask", "distributed") if importlib.util.find_spec(p) is None]
    if no_dask:
        assert "kiln-wire[dask]" in out["mods"].pop("dask")
    assert out["mods"] == {n: "kiln." + n for n in out["mods"]}
    assert out["dir"] == [] and out["open is files.open"] is True
    if no_dask:   # everything else was checked
        pytest.skip("kiln.dask not imported: %s not installed (pip install 'kiln-wire[dask]')"
                    % " and ".join(no_dask))


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kiln.nope
    assert not hasattr(kiln, "_kernels_nope")


def test_writing_files_imports_the_pure_kernel_only_when_it_is_in_use(tmp_path, impl):
    a, b = str(tmp_path / "a.kiln"), str(tmp_path / "b.kiln")
    out = _child(impl, r"""
import numpy as np, kiln
kiln.save_tensors(%r, {"a": np.arange(4, dtype=np.int16)})
with kiln.TensorWriter(%r) as w:
    w.add("b", "f32", (2,))
    w.write("b", np.float32([1, 2]))
report(({"impl": kiln.IMPLEMENTATION, "pure": "kiln._kernels_py" in sys.modules,
                  "read": kiln.load_tensors(%r)["a"].numpy().tolist()}))
""" % (a, b, a))
    assert out == {"pure": impl.name == "python", "read": [0, 1, 2, 3]}
    assert (tmp_path / "a.kiln").read_bytes() == \
        kiln.encode_tensors({"a": np.arange(4, dtype=np.int16)})
    assert (tmp_path / "b.kiln").read_bytes() == kiln.encode_tensors({"b": np.float32([1, 2])})


@pytest.mark.parametrize("argv", [["check"], ["inspect"], ["inspect", "--json"]])
def test_the_command_line_loads_what_its_command_needs(tmp_path, impl, argv):
    p = tmp_path / "small.kiln"
    kiln.save_tensors(p, {"x": np.float32([1.5])})
    # a local file: neither the remote reader nor http.client (issue 52)
    watched = [m for m in _watched(impl) if m not in ("kiln.files", "kiln.cli", "kiln._meta",
                                                       "kiln._rows", "kiln._files",
                                                       "kiln._cli", "kiln._access")]
    watched += ["kiln.remote", "kiln._files.remote", "kiln._files.fetch", "http.client",
                "kiln._cli.demo", "kiln._cli.cases", "kiln.convert"]
    # nor the writers, the sets, the record commands, or shutil (issue 52)
    watched += ["kiln._files.save", "kiln._files.writer", "kiln._files.atomic",
                "kiln._files.shardsave", "kiln._files.sharded", "kiln._files.tied",
                "kiln._cli.records", "shutil"]
    out = _child(impl, r"""
import runpy, io, contextlib
sys.argv = ["kiln"] + %r + [%r]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        runpy.run_module("kiln", run_name="__main__")
    except SystemExit as e:
        code = e.code
import kiln
report(({"impl": kiln.IMPLEMENTATION, "code": code, "out": buf.getvalue(),
                  "loaded": loaded(%r)}))
""" % (argv, str(p), watched + ["tempfile"] + ([] if "--json" in argv else ["json", "argparse"])))
    assert out["code"] == 0 and out["loaded"] == []
    if argv == ["check"]:
        assert out["out"].startswith("%s: valid: structure checked" % p)
    elif "--json" in argv:
        assert json.loads(out["out"])["tensors"][0]["name"] == "x"
    else:
        assert "tensor directory" in out["out"]


@pytest.mark.parametrize("argv", [["inspect", "m.kiln"], ["check", "m.kiln"],
                                  ["check", "a b.kiln"], ["inspect", ""]])
def test_a_bare_command_gets_what_the_parser_would_make(argv):
    # kiln inspect FILE and kiln check FILE skip argparse (issue 52): the same
    # namespace as the parser's, fn included, for every command main takes so
    from kiln import cli
    parsed = cli.build_parser(argv[0]).parse_args(argv)
    assert vars(cli._bare(argv)) == vars(parsed)
    assert sorted(cli.BARE) == ["check", "inspect"]


@pytest.mark.parametrize("argv", [["inspect", "-h"], ["inspect", "f", "--json"], ["check"],
                                  ["convert", "a", "b"], ["inspect", "--type", "i32"],
                                  ["--version"], []])
def test_every_other_command_line_goes_to_the_parser(argv):
    from kiln import cli
    from kiln._cli import common, parser
    assert cli._bare(argv) is None
    assert sorted(parser.COMMANDS) == sorted(common.RUNNERS)   # one table of commands
