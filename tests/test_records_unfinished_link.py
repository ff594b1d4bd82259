"""kiln.records.unfinished(link) where link is a symbolic link (issue 56 item
13): a RecordWriter of the link writes beside the file the link names, so
that is where unfinished looks.  Both kernels.

Oracles: the records each writer wrote (hand-written values), a real child
process killed by SIGKILL before close, and where the file really is."""

import os
import signal
import subprocess
import sys
import textwrap

import kiln

TEXT = "struct{id:i64,name:str,}"

_KILLED = textwrap.dedent("""
    import os, signal, sys, kiln
    w = kiln.RecordWriter(sys.argv[1], "struct{id:i64,name:str,}")
    for i in range(40):
        w.write({"id": i, "name": "n%d" % i})
    w.flush()
    os.kill(os.getpid(), signal.SIGKILL)   # before close: the file is never put in place
""")


def _link_to_elsewhere(tmp_path, name="log.kilnr"):
    """(link, target): the link in one folder, the file it names in another."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "data" / name
    link = tmp_path / "links" / name
    os.symlink(target, link)   # dangling until a writer puts the file in place
    return link, target


def test_a_killed_writer_of_a_link_is_found_through_the_link(impl, tmp_path):
    link, target = _link_to_elsewhere(tmp_path)
    r = subprocess.run([sys.executable, "-c", _KILLED, str(link)], capture_output=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not target.exists() and os.path.islink(link)
    found = kiln.records.unfinished(link)
    assert len(found) == 1, (found, os.listdir(tmp_path / "data"))
    (left,) = found
    assert os.path.dirname(left) == str(tmp_path / "data")   # beside the link's target
    assert kiln.records.unfinished(target) == found          # the same files either way
    with kiln.RecordFile(left, TEXT, recover=True, kernels=impl.kernels) as rf:
        assert [(v["id"], v["name"]) for v in rf] == [(i, "n%d" % i) for i in range(40)]


def test_a_writer_left_by_an_error_through_a_link_to_a_link(impl, tmp_path):
    link, target = _link_to_elsewhere(tmp_path)
    (tmp_path / "more").mkdir()
    outer = tmp_path / "more" / "outer.kilnr"
    os.symlink(link, outer)   # a link to the link: the writer goes to the final target
    try:
        with kiln.RecordWriter(outer, TEXT, kernels=impl.kernels) as w:
            w.write({"id": 7, "name": "seven"})
            raise RuntimeError("the producer failed")
    except RuntimeError:
        pass
    (left,) = kiln.records.unfinished(outer)
    assert os.path.dirname(left) == str(tmp_path / "data")
    assert kiln.records.unfinished(link) == [left]
    with kiln.RecordFile(left, TEXT, recover=True, kernels=impl.kernels) as rf:
        assert [v["id"] for v in rf] == [7]


def test_a_loop_of_links_has_no_unfinished_files(tmp_path):
    a, b = tmp_path / "a.kilnr", tmp_path / "b.kilnr"
    os.symlink(b, a)
    os.symlink(a, b)
    assert kiln.records.unfinished(a) == []
