"""Issue 40 item 6: errors a person can read.  One format for a file's fault
(``<path>: <CODE> at byte N: <what>``, the path once, never a temporary
file's name), usage problems as usage errors (exit 2, no wire code), JSON
Lines faults by file, line and field, GGUF block types by name, help that
describes each command, and counts in words that agree with the number.

The commands run in a child process on each kernel (``KILN_PUREPYTHON``)."""
import dataclasses
import datetime
import json
import os
import pathlib
import struct
import typing
import subprocess
import sys

import numpy as np
import pytest
from numpy.typing import NDArray

import kiln

from kiln._errors import CODES

from _util import ROOT

KERNELS = ["python", "cython"]


def run(*args, kernels="python", cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KILN_PUREPYTHON", None)
    if kernels == "python":
        env["KILN_PUREPYTHON"] = "1"
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                       text=True, timeout=120, cwd=cwd, env=env)
    return r.returncode, r.stdout, r.stderr


def one_line(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(params=KERNELS)
def kernels(request):
    if request.param == "cython":
        from conftest import compiled_kernels
        compiled_kernels(request.config)   # an error under --c-extensions when missing
    return request.param


def test_a_missing_destination_folder_names_the_destination(tmp_path, kernels):
    np.savez(tmp_path / "a.npz", x=np.ones(3))
    code, _, err = run("convert", "a.npz", "nodir/x.kiln", kernels=kernels, cwd=tmp_path)
    line = one_line(err)
    assert code == 2, err
    assert "kiln-tmp" not in line and ".x.kiln." not in line, line
    assert line.startswith("kiln convert: ") and "x.kiln" in line and "nodir" in line, line
    assert "No such file or directory" in line, line
    assert os.listdir(tmp_path) == ["a.npz"]


def test_the_library_names_the_file_asked_for_too(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        kiln.save_tensors(tmp_path / "nodir" / "y.kiln", {"a": np.ones(2)})
    assert e.value.filename == str(tmp_path / "nodir" / "y.kiln")
    assert "kiln-tmp" not in str(e.value)


@pytest.mark.parametrize("src, dst", [("a.npz", "b.safetensors"), ("a.npz", "b.gguf"),
                                      ("a.npz", "b.txt"), ("a.txt", "b.kiln")])
def test_a_conversion_kiln_does_not_make_is_a_usage_error(tmp_path, kernels, src, dst):
    np.savez(tmp_path / "a.npz", x=np.ones(3))
    (tmp_path / "a.txt").write_text("x")
    code, _, err = run("convert", src, dst, kernels=kernels, cwd=tmp_path)
    line = one_line(err)
    assert code == 2, err
    assert " at byte " not in line and "FRAME" not in line, line
    assert ("no conversion from" in line) or ("unknown format" in line), line
    assert not (tmp_path / dst).exists()


def test_checksum_into_a_foreign_format_is_a_usage_error(tmp_path, kernels):
    np.savez(tmp_path / "a.npz", x=np.ones(3))
    kiln.save_tensors(tmp_path / "a.kiln", {"x": np.ones(3)})
    code, _, err = run("convert", "--checksum", "a.kiln", "b.npz", kernels=kernels, cwd=tmp_path)
    assert code == 2 and "FRAME" not in one_line(err), err


def test_a_faulty_file_is_named_once_with_its_code_and_offset(tmp_path, kernels):
    kiln.save_tensors(tmp_path / "m.kiln", {"w": np.ones(2)})
    data = bytearray((tmp_path / "m.kiln").read_bytes())
    data[4] = 9   # the version byte: an unknown version
    (tmp_path / "m.kiln").write_bytes(bytes(data))
    for cmd in ("inspect", "check"):
        code, out, err = run(cmd, "m.kiln", kernels=kernels, cwd=tmp_path)
        line = one_line(err if cmd == "inspect" else out)
        assert code == 1, (out, err)
        body = line.split("kiln inspect: ", 1)[-1]
        assert body.startswith("m.kiln: ") and body.count("m.kiln") == 1, line
        code_word, rest = body[len("m.kiln: "):].split(" at byte ", 1)
        assert code_word in CODES, line
        assert rest.split(":", 1)[0].isdigit(), line


JSONL_TYPE = "struct{a:i64,b:list<i32>,}"


@pytest.mark.parametrize("lines, expect", [
    (['{"a": 1, "b": []}', '{"a": "x", "b": []}'], "t.jsonl: line 2, field a: "),
    (['{"a": 1, "b": [1, 2, "z"]}'], "t.jsonl: line 1, field b[2]: "),
    (['{"a": 1, "b": []}', '', 'nope'], "t.jsonl: line 3: not JSON"),
    (['[1, 2]'], "t.jsonl: line 1: "),
])
def test_json_lines_faults_name_the_file_line_and_field(tmp_path, kernels, lines, expect):
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = run("convert", "t.jsonl", "t.kilnr", "--type", JSONL_TYPE, kernels=kernels,
                       cwd=tmp_path)
    line = one_line(err)
    assert code == 1, err
    assert line.startswith("kiln convert: " + expect), line
    assert " at byte " not in line and "$" not in line, line
    assert not (tmp_path / "t.kilnr").exists()


def test_json_lines_errors_carry_the_line_and_field(tmp_path):
    from kiln.records.tools import JsonLinesError, jsonl_to_records
    src = str(tmp_path / "t.jsonl")
    with open(src, "w") as f:
        f.write('{"a": 1, "b": []}\n{"a": 1, "b": [1, "z"]}\n')
    with pytest.raises(JsonLinesError) as e:
        jsonl_to_records(src, str(tmp_path / "t.kilnr"), JSONL_TYPE)
    assert (e.value.path, e.value.line, e.value.field) == (src, 2, "$.b[1]")
    assert e.value.code == "TYPE" and isinstance(e.value, ValueError)
    assert str(e.value).startswith(src + ": line 2, field b[1]: ")


def test_a_bad_type_argument_is_a_usage_error(tmp_path, kernels):
    (tmp_path / "t.jsonl").write_text('{"a": 1}\n')
    code, _, err = run("convert", "t.jsonl", "t.kilnr", "--type", "struct{a:i64",
                       kernels=kernels, cwd=tmp_path)
    line = one_line(err)
    assert code == 2 and line.startswith("kiln convert: --type ") and "t.jsonl" not in line, line


def _gguf_q8(path):
    """A GGUF v3 file by hand: one Q8_0 tensor (ggml type 8) of 2 x 32 elements,
    two blocks of 34 bytes (an f16 scale and 32 int8), data aligned to 32."""
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    head += s("blk.0.w") + struct.pack("<I", 2) + struct.pack("<QQ", 32, 2) \
        + struct.pack("<IQ", 8, 0)
    head += bytes(-len(head) % 32)
    path.write_bytes(head + bytes(68))


def test_gguf_block_types_by_name(tmp_path, kernels):
    _gguf_q8(tmp_path / "q.gguf")
    code, out, err = run("convert", "q.gguf", "q.kiln", kernels=kernels, cwd=tmp_path)
    assert code == 0, err
    assert "1 tensor in" in out and "1 tensors" not in out, out
    code, out, err = run("inspect", "q.kiln", kernels=kernels, cwd=tmp_path)
    assert code == 0, err
    row = [ln for ln in out.splitlines() if ln.startswith("blk.0.w")][0].split()
    assert row[1] == "Q8_0" and "4104" not in out, out
    with kiln.open(tmp_path / "q.kiln") as f:
        assert f["blk.0.w"].dtype == 4104   # the code itself is unchanged
        assert repr(f["blk.0.w"]) == "<kiln.Tensor 'blk.0.w' Q8_0[2, 32], 68 bytes>"
        assert repr(f).endswith(", 1 tensor>")
        assert repr(f.tensors()) == "<kiln.TensorDirectory of 1 tensor>"


def test_counts_agree_with_their_number(tmp_path, kernels):
    kiln.save_tensors(tmp_path / "one.kiln", {"w": np.ones(2)}, checksum=True)
    code, out, _ = run("check", "one.kiln", kernels=kernels, cwd=tmp_path)
    assert code == 0 and "1 tensors" not in out and "the tensor" in out, out
    (tmp_path / "r.jsonl").write_text('{"a": 1, "b": []}\n')
    code, out, err = run("convert", "r.jsonl", "r.kilnr", "--type", JSONL_TYPE, kernels=kernels,
                         cwd=tmp_path)
    assert code == 0 and "1 record in" in out, out + err
    code, out, _ = run("inspect", "r.kilnr", kernels=kernels, cwd=tmp_path)
    assert code == 0 and "1 record," in out, out
    code, out, _ = run("check", "r.kilnr", kernels=kernels, cwd=tmp_path)
    assert code == 0 and "valid, 1 record" in out and "1 records" not in out, out


@pytest.mark.parametrize("cmd, words", [
    ("inspect", ["--type", "--json", "--recover", ".kilnr", ".kiln", "URL"]),
    ("check", ["--type", "--framed", "--recover", ".kilnr", ".kiln", "CRC-32"]),
    ("convert", ["--schema", "--type", "--checksum", ".jsonl", ".kilnr", ".safetensors",
                 ".gguf", ".npz", "src", "dst"]),
])
def test_help_describes_the_command_and_each_argument(cmd, words):
    code, out, _ = run(cmd, "--help")
    assert code == 0
    for w in words:
        assert w in out, (w, out)
    # every argument has a description: no bare "  file" or "  src" line
    for ln in out.splitlines():
        if ln.startswith("  ") and not ln.startswith("   "):
            first = ln.split()[0]
            if first.startswith("-") or first in ("file", "src", "dst"):
                assert len(ln.split()) > 1 + (first.startswith("--") and first not in (
                    "--json", "--recover", "--framed", "--checksum")), ln


# --- issue 49 item 9: papercuts -----------------------------------------------------

def test_gguf_block_types_by_name_in_conversion_errors(tmp_path, kernels):
    _gguf_q8(tmp_path / "q.gguf")
    code, _, err = run("convert", "q.gguf", "q.kiln", kernels=kernels, cwd=tmp_path)
    assert code == 0, err
    for dst in ("q.safetensors", "q.npz"):
        code, _, err = run("convert", "q.kiln", dst, kernels=kernels, cwd=tmp_path)
        assert code == 1 and "tensor 'blk.0.w' is Q8_0" in err and "4104" not in err, err


def test_torch_names_a_block_type_it_cannot_load(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested where "
                                        "it is")
    import kiln.torch as kt
    _gguf_q8(tmp_path / "q.gguf")
    kiln.convert.convert(str(tmp_path / "q.gguf"), str(tmp_path / "q.kiln"))
    with pytest.raises(kiln.KilnError) as e:
        kt.load_file(tmp_path / "q.kiln")
    assert "is Q8_0" in str(e.value) and "4104" not in str(e.value)


@pytest.mark.parametrize("command", [["inspect", "x.kiln"], ["check", "x.kiln"],
                                     ["convert", "x.jsonl", "x.kilnr"]])
def test_bad_type_text_is_a_usage_error_in_every_command(tmp_path, kernels, command):
    kiln.save_tensors(tmp_path / "x.kiln", {"w": np.ones(2)})
    (tmp_path / "x.jsonl").write_text('{"id": 1}\n')
    code, _, err = run(*command, "--type", "struct{id:i64", kernels=kernels, cwd=tmp_path)
    line = one_line(err)
    assert code == 2 and "--type" in line and "x.kiln:" not in line, line


def test_kiln_gen_names_the_keyword_outside_the_subset(tmp_path, kernels):
    (tmp_path / "s.json").write_text(json.dumps({"type": "object", "properties": {
        "a": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}}))
    code, _, err = run("gen", "s.json", kernels=kernels, cwd=tmp_path)
    assert code == 1 and "'oneOf'" in err and "'None'" not in err, err
    (tmp_path / "t.json").write_text(json.dumps({"type": "object", "properties": {
        "b": {"type": "integer", "weird": 1}}}))
    code, _, err = run("gen", "t.json", kernels=kernels, cwd=tmp_path)
    assert code == 1 and "an integer" in err and "a integer" not in err, err


@pytest.mark.parametrize("ann, hint", [
    (datetime.time, "timedelta"), (set, "list[T]"), (frozenset, "list[T]"),
    (typing.Set[int], "list[T]"), (complex, "tuple[float, float]"),
    (pathlib.Path, "str(path)"), (typing.Any, "every field needs one type"),
    (NDArray[np.float16], "tensors field"),
], ids=str)
def test_refused_annotations_say_what_to_write_instead(ann, hint):
    @dataclasses.dataclass
    class C:
        x: ann  # type: ignore[valid-type]

    with pytest.raises(TypeError) as e:
        kiln.as_type(C)
    assert hint in str(e.value), str(e.value)


def test_check_of_a_saved_record_without_its_type_says_so(tmp_path, kernels):
    # a framed record (with kiln.save's pad head, and without): the frame names the type by
    # hash only, so the value cannot be checked without --type: a usage error that says so
    p = tmp_path / "rec.kiln"
    kiln.save(p, {"id": 1, "x": {"w": np.ones(3, np.float32)}}, "struct{id:i64,x:tensors,}", store_type=False)
    q = tmp_path / "list.kiln"
    kiln.save(q, [1, 2], "list<i64>", store_type=False)
    for f in (p, q):
        code, out, err = run("check", str(f), kernels=kernels)
        assert code == 2, (code, out, err)
        line = one_line(err)
        assert "framed record" in line and "--type" in line and "neither" not in line
    code, out, err = run("check", str(q), "--type", "list<i64>", kernels=kernels)
    assert code == 0 and "valid" in out
