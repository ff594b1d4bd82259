"""kiln inspect / check / convert on record files, through a subprocess."""

import base64
import json
import os
import types

import kiln
import _records_util as U
from test_cli import run
SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"},
    "w": {"type": "array", "items": {"type": "number"}},
    "raw": {"type": "string", "format": "binary"}}, "required": ["id", "name", "w", "raw"]}
TEXT = "struct{id:i64,name:str,w:list<f64>,raw:list<u8>,}"
ROWS = [{"id": 1, "name": "a\u00e9", "w": [1.5, 2.0], "raw": base64.b64encode(b"\0\1").decode()},
        {"id": 2, "name": "", "w": [], "raw": ""}]


def kiln_cli(impl, *args, cwd):
    """``kiln ARGS`` on ``impl``'s kernels (test_cli.run checks the child's kernels)."""
    code, out, err = run(*args, env_impl=impl.name, cwd=cwd)
    return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_convert_jsonl_both_ways_inspect_check(impl, tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    r = kiln_cli(impl, "convert", "d.jsonl", "d.kilnr", "--schema", "s.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    want = [{"id": 1, "name": "a\u00e9", "w": [1.5, 2.0], "raw": b"\0\1"},
            {"id": 2, "name": "", "w": [], "raw": b""}]
    data = (tmp_path / "d.kilnr").read_bytes()
    assert data == U.container(kiln.parse_type(TEXT).schema_hash,
                               [kiln.encode(v, TEXT, frame=True) for v in want], text=TEXT)[0]
    with kiln.RecordFile(tmp_path / "d.kilnr", TEXT, kernels=impl.kernels) as rf:
        assert rf[1]["name"] == "" and rf[0]["raw"] == b"\0\1"
    r = kiln_cli(impl, "inspect", "d.kilnr", "--json", cwd=tmp_path)
    rep = json.loads(r.stdout)
    assert (rep["records"], rep["schema_hash"]) == (2, "0x%016x" %
                                                    kiln.parse_type(TEXT).schema_hash)
    assert kiln_cli(impl, "check", "d.kilnr", cwd=tmp_path).returncode == 0
    r = kiln_cli(impl, "check", "d.kilnr", "--type", TEXT, cwd=tmp_path)
    assert r.returncode == 0 and "2 records" in r.stdout
    r = kiln_cli(impl, "convert", "d.kilnr", "back.jsonl", "--type", TEXT, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in (tmp_path / "back.jsonl").read_text().splitlines()] == ROWS


def test_check_finds_the_bad_record(impl, tmp_path):
    fr = [kiln.encode({"id": i, "name": "x"}, "struct{id:i64,name:str,}", frame=True)
          for i in range(3)]
    h = kiln.parse_type("struct{id:i64,name:str,}").schema_hash
    data, offs = U.container(h, fr)
    bad = bytearray(data)
    bad[offs[2] + 20] ^= 0xFF                 # inside record 2's frame: its CRC fails
    (tmp_path / "b.kilnr").write_bytes(bytes(bad))
    r = kiln_cli(impl, "check", "b.kilnr", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.startswith("b.kilnr: CHECKSUM at byte %d:" % (offs[2] + 16 + len(fr[2])))
    (tmp_path / "t.kilnr").write_bytes(data[:-3])
    r = kiln_cli(impl, "inspect", "t.kilnr", cwd=tmp_path)
    assert r.returncode == 1 and "trailer" in r.stderr
    # a value of another type inside: only the typed check sees its contents, both see the hash
    other = kiln.encode(5, "i64", frame=True)
    data, offs = U.container(h, fr[:1] + [other])
    (tmp_path / "o.kilnr").write_bytes(data)
    r = kiln_cli(impl, "check", "o.kilnr", cwd=tmp_path)
    assert r.returncode == 1 and "SCHEMA at byte %d" % (offs[1] + 24) in r.stdout


def test_convert_errors_name_the_line(impl, tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps(ROWS[0]) + "\n{\"id\": \"x\"}\n")
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    r = kiln_cli(impl, "convert", "d.jsonl", "d.kilnr", "--schema", "s.json", cwd=tmp_path)
    assert r.returncode == 1 and "line 2" in r.stderr
    assert not (tmp_path / "d.kilnr").exists()
    r = kiln_cli(impl, "convert", "d.jsonl", "d.kilnr", cwd=tmp_path)
    assert r.returncode == 2 and "--schema" in r.stderr


def test_the_command_line_knows_the_record_magic():
    from kiln import _wire
    from kiln._cli import common
    from kiln.records import _format
    assert _format.MAGIC is _wire.RECORDS_MAGIC   # one place, which the command line reads
    assert "KLNR" not in open(common.__file__).read()


def test_a_failed_conversion_leaves_the_destination_as_it_was(impl, tmp_path):
    """jsonl -> kilnr and kilnr -> jsonl write through the atomic replace: a
    failure keeps an existing destination byte for byte and leaves no partial
    output or temporary file (once: the .kilnr was deleted, the .jsonl half
    written)."""
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "bad.jsonl").write_text(json.dumps(ROWS[0]) + "\n{\"id\": \"x\"}\n")
    (tmp_path / "d.kilnr").write_bytes(b"the old file")
    r = kiln_cli(impl, "convert", "bad.jsonl", "d.kilnr", "--schema", "s.json", cwd=tmp_path)
    assert r.returncode == 1 and "line 2" in r.stderr
    assert (tmp_path / "d.kilnr").read_bytes() == b"the old file"
    # a record file whose second record is damaged: the first converts, then a failure
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ROWS))
    r = kiln_cli(impl, "convert", "d.jsonl", "good.kilnr", "--schema", "s.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = bytearray((tmp_path / "good.kilnr").read_bytes())
    with kiln.RecordFile(tmp_path / "good.kilnr", TEXT, kernels=impl.kernels) as rf:
        second = rf.offsets[1] if hasattr(rf, "offsets") else None
    at = data.index(b"\x02\x00\x00\x00\x00\x00\x00\x00") if second is None else second + 20
    data[at] ^= 0x40                                       # inside record 2: its CRC fails
    (tmp_path / "torn.kilnr").write_bytes(bytes(data))
    (tmp_path / "back.jsonl").write_text("old line\n")
    r = kiln_cli(impl, "convert", "torn.kilnr", "back.jsonl", "--type", TEXT, cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert (tmp_path / "back.jsonl").read_text() == "old line\n"
    assert not [n for n in __import__("os").listdir(tmp_path) if n.endswith(".kiln-tmp")]


def test_an_exception_inside_the_writer_block_leaves_a_file_that_is_not_complete(impl, tmp_path):
    """with RecordWriter(path): an exception in the block writes no index and no
    trailer (once: the file opened as complete); the records written before it
    are there for recover=True."""
    p = tmp_path / "x.kilnr"
    try:
        with kiln.RecordWriter(p, TEXT, kernels=impl.kernels) as w:
            w.write({"id": 1, "name": "a", "w": [], "raw": b""})
            w.write({"id": 2, "name": "b", "w": [0.5], "raw": b"\1"})
            raise RuntimeError("the producer failed")
    except RuntimeError:
        pass
    import pytest
    assert not p.exists()   # the path never held the torn file: it is beside it
    (left,) = kiln.records.unfinished(p)
    with pytest.raises(kiln.KilnError):
        kiln.RecordFile(left, TEXT, kernels=impl.kernels)
    with kiln.RecordFile(left, TEXT, recover=True, kernels=impl.kernels) as rf:
        assert [v["id"] for v in rf] == [1, 2]
    # with replace="open" the path itself is the file being written, as before
    try:
        with kiln.RecordWriter(p, TEXT, kernels=impl.kernels, replace="open") as w:
            w.write({"id": 1, "name": "a", "w": [], "raw": b""})
            raise RuntimeError("the producer failed")
    except RuntimeError:
        pass
    with kiln.RecordFile(p, TEXT, recover=True, kernels=impl.kernels) as rf:
        assert [v["id"] for v in rf] == [1]
    os.remove(p)
    # no exception: complete, as before
    with kiln.RecordWriter(p, TEXT, kernels=impl.kernels) as w:
        w.write({"id": 3, "name": "c", "w": [], "raw": b""})
    with kiln.RecordFile(p, TEXT, kernels=impl.kernels) as rf:
        assert [v["id"] for v in rf] == [3]


def test_inspect_and_check_of_a_torn_file_and_a_wrong_type(impl, tmp_path):
    """A torn record file: inspect and check fail naming the path once, with
    the code and offset, and point at --recover, which the commands have;
    --recover reports the complete records. inspect --type of another type
    fails (once: exit 0)."""
    p = tmp_path / "k.kilnr"
    with kiln.RecordWriter(p, TEXT, kernels=impl.kernels) as w:
        w.write({"id": 1, "name": "a", "w": [], "raw": b""})
        w.write({"id": 2, "name": "b", "w": [0.5], "raw": b"\1"})
    r = kiln_cli(impl, "inspect", "k.kilnr", "--type", "struct{b:str,}", cwd=tmp_path)
    assert r.returncode == 1 and "does not match the file" in r.stdout
    assert kiln_cli(impl, "inspect", "k.kilnr", "--type", TEXT, cwd=tmp_path).returncode == 0
    data = p.read_bytes()
    (tmp_path / "t.kilnr").write_bytes(data[:-10])           # the trailer cut
    for cmd in ("inspect", "check"):
        r = kiln_cli(impl, cmd, "t.kilnr", cwd=tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 1
        assert out.count("t.kilnr") == 1 and "FRAME at byte " in out, out
        assert "--recover" in out and "recover=True" not in out, out
    r = kiln_cli(impl, "inspect", "t.kilnr", "--recover", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["records"] == 2 and rep["torn"]["why"].startswith("FRAME at byte ")
    r = kiln_cli(impl, "check", "t.kilnr", "--recover", "--type", TEXT, cwd=tmp_path)
    assert r.returncode == 1 and "torn: 2 complete records valid" in r.stdout, r.stdout
    assert r.stdout.count("t.kilnr") == 1


def test_a_file_that_stores_its_type_needs_no_type(impl, tmp_path):
    """Issue 40 item 4: inspect, check and convert .kilnr -> .jsonl with no
    --type read the type text of the file's head; a file that stores only the
    hash (store_type=False, the layout before it) is a usage error for convert."""
    h = kiln.parse_type(TEXT).schema_hash
    want = [{"id": 1, "name": "a\u00e9", "w": [1.5, 2.0], "raw": b"\0\1"},
            {"id": 2, "name": "", "w": [], "raw": b""}]
    framed = [kiln.encode(v, TEXT, frame=True) for v in want]
    (tmp_path / "d.kilnr").write_bytes(U.container(h, framed, text=TEXT)[0])
    r = kiln_cli(impl, "convert", "d.kilnr", "back.jsonl", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in (tmp_path / "back.jsonl").read_text().splitlines()] == ROWS
    r = kiln_cli(impl, "inspect", "d.kilnr", cwd=tmp_path)
    assert r.returncode == 0 and "stored type %s" % TEXT in r.stdout, r.stdout
    assert '"name": "a\u00e9"' in r.stdout or '"name": "a\\u00e9"' in r.stdout, r.stdout
    rep = json.loads(kiln_cli(impl, "inspect", "d.kilnr", "--json", cwd=tmp_path).stdout)
    assert rep["stored_type"] == TEXT and len(rep["first"]) == 2
    r = kiln_cli(impl, "check", "d.kilnr", cwd=tmp_path)
    assert r.returncode == 0 and "--type also decodes" not in r.stdout, r.stdout
    (tmp_path / "old.kilnr").write_bytes(U.container(h, framed)[0])
    r = kiln_cli(impl, "convert", "old.kilnr", "x.jsonl", cwd=tmp_path)
    assert r.returncode == 2 and "--type" in r.stderr and "type hash only" in r.stderr, r.stderr
    assert not (tmp_path / "x.jsonl").exists()
    r = kiln_cli(impl, "inspect", "old.kilnr", cwd=tmp_path)
    assert r.returncode == 0 and "stored type" not in r.stdout
