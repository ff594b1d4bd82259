"""kiln as the storage of torch.distributed.checkpoint (issue 59), on DCP's
own engine: real rank processes in a gloo group on loopback (2 and 4
ranks), DTensors on a CPU device mesh and FSDP2's ``fully_shard``, saves,
resharded loads, ``async_save``, consolidation and ranks killed with
SIGKILL at each step of a save.

The rank processes are forked from the test process (torch is imported once,
not once per rank: a spawn costs ~4 s of imports per rank on a 2-core
machine); a forked rank runs torch with one thread (libgomp's pool does not
survive a fork) and inherits the kernels the ``api`` fixture chose.  Every
rank is killed by the test that started it.  The oracle is the state dict
built in one process (``_full``), compared bit for bit (as bytes); FSDP2's
expected values are its own ``full_tensor()`` gathers, saved by torch.
"""

import datetime
import json
import multiprocessing
import os
import signal
import time
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():   # pragma: no cover
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

import torch.distributed.checkpoint as dcp   # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException   # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh   # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor   # noqa: E402

import kiln   # noqa: E402
import kiln.cli   # noqa: E402
import kiln.torch   # noqa: E402
from kiln import _compat   # noqa: E402
from kiln.torch import distributed as kd   # noqa: E402

RANK_TIMEOUT = 45   # seconds a group may take before the test kills it (never reached)


# --- the state dict of one process: the oracle ----------------------------------------

def _full(shift=0):
    g = torch.Generator().manual_seed(59 + shift)
    return {
        "w0": torch.randn(10, 6, generator=g),                       # 10 rows on 4: 3 3 3 1
        "w1": torch.randn(7, 5, generator=g).to(torch.bfloat16),     # Shard(1): 2 2 1 0
        "w2": torch.randn(3, 4, generator=g).to(torch.float16),      # Shard(0): 1 1 1 0
        "rep": torch.randn(4, 4, generator=g, dtype=torch.float64),  # replicated
        "ids": torch.randint(-1000, 1000, (9,), generator=g),
        "mask": torch.rand(5, 3, generator=g) > 0.5,
        "big": torch.randn(300, 64, generator=g),                    # runs of 64 KiB+
    }


def _extras(shift=0):
    return {"step": 3 + shift, "sched": {"lr": 0.25, "name": "cosine"}}


SAVE_PL = {"w0": Shard(0), "w1": Shard(1), "w2": Shard(0), "rep": Replicate(),
           "ids": Shard(0), "mask": Shard(1), "big": Shard(0)}
OTHER_PL = {"w0": Shard(1), "w1": Shard(0), "w2": Replicate(), "rep": Shard(0),
            "ids": Replicate(), "mask": Shard(0), "big": Shard(1)}
ROWS_PL = {k: Replicate() if k == "rep" else Shard(0) for k in SAVE_PL}


def _bits(t):
    t = t.detach().contiguous()
    return bytes(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and _bits(a) == _bits(b)


def _nbytes(t):
    return t.numel() * t.element_size()


# --- rank processes --------------------------------------------------------------------

def _rank_main(scenario, rank, world, store, out, args):
    """One rank: join the group, run the scenario, leave its result in ``out``."""
    code = 1
    try:
        torch.set_num_threads(1)   # libgomp's thread pool does not survive a fork
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=30))
        res = SCENARIOS[scenario](rank, world, out, **args)
        res["impl"] = _compat.IMPLEMENTATION
        with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()
        code = 0
    except BaseException:
        with open(os.path.join(out, "rank%d.err" % rank), "w") as f:
            f.write(traceback.format_exc())
    finally:
        os._exit(code)   # never the test process's exit handlers


def _start(tmp_path, scenario, world, **args):
    """Fork ``world`` ranks running ``scenario``; the handle ``_finish`` takes."""
    out = tmp_path / ("run-%s-%d-%d" % (scenario, world, time.monotonic_ns()))
    out.mkdir()
    ctx = multiprocessing.get_context("fork")
    procs = []
    try:
        for r in range(world):
            p = ctx.Process(target=_rank_main, args=(scenario, r, world, str(out / "store"),
                                                     str(out), args), daemon=True)
            procs.append(p)
            p.start()
    except BaseException:
        _finish((procs, out), 0)
        raise
    return procs, out


def _finish(handle, timeout=RANK_TIMEOUT):
    """Wait for a group's ranks (killing any still running after ``timeout``
    seconds); (exit codes, results, errors)."""
    procs, out = handle
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            if p.pid is not None:
                p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
            if p.pid is not None:
                p.join()
    results, errors = {}, {}
    for r in range(len(procs)):
        if (out / ("rank%d.json" % r)).exists():
            results[r] = json.loads((out / ("rank%d.json" % r)).read_text())
        if (out / ("rank%d.err" % r)).exists():
            errors[r] = (out / ("rank%d.err" % r)).read_text()
    return [p.exitcode for p in procs], results, errors


def _launch(tmp_path, scenario, world, **args):
    """Run ``scenario`` on ``world`` forked ranks; (exit codes, results, errors).
    Every rank is killed before this returns."""
    return _finish(_start(tmp_path, scenario, world, **args))


def _ok(codes, results, errors, impl):
    assert not errors, "\n".join(errors.values())
    assert codes == [0] * len(codes)
    assert {r["impl"] for r in results.values()} == {impl.name}


def _dstate(mesh, placements, shift=0, zeros=False):
    sd = {}
    for k, v in _full(shift).items():
        if zeros:
            v = torch.zeros_like(v)
        sd[k] = distribute_tensor(v, mesh, [placements[k]])
    return sd


def _check_local(sd, mesh, placements, shift=0):
    """The names whose local shard differs from the oracle's shard."""
    want = _dstate(mesh, placements, shift)
    return [k for k in want if not _same(sd[k].to_local(), want[k].to_local())]


def _local_bytes(sd):
    return sum(_nbytes(v.to_local()) for k, v in sd.items() if k in SAVE_PL)


# --- scenarios (run in every rank) ------------------------------------------------------

def _sc_dtensor(rank, world, out, ckpt, ckpt2, set2):
    res = {"bad": []}
    mesh = init_device_mesh("cpu", (world,))
    sd = _dstate(mesh, SAVE_PL)
    sd.update(_extras())
    dcp.save(sd, storage_writer=kd.KilnStorageWriter(ckpt, thread_count=3, checksum=True))

    # same layout, tensors only: each rank reads exactly its own chunks
    back = _dstate(mesh, SAVE_PL, zeros=True)
    reader = kd.KilnStorageReader(ckpt)
    dcp.load(back, storage_reader=reader)
    res["bad"] += ["same:" + k for k in _check_local(back, mesh, SAVE_PL)]
    res["same_read"], res["same_local"] = reader.bytes_read, _local_bytes(back)

    # resharded into 4 ranks with other placements, extras included
    back = _dstate(mesh, OTHER_PL, zeros=True)
    back.update({"step": 0, "sched": {"lr": 0.0, "name": ""}})
    reader = kd.KilnStorageReader(ckpt, thread_count=2)
    dcp.load(back, storage_reader=reader)
    res["bad"] += ["other:" + k for k in _check_local(back, mesh, OTHER_PL)]
    if back["step"] != 3 or back["sched"] != _extras()["sched"]:
        res["bad"].append("other:extras %r %r" % (back["step"], back["sched"]))
    res["other_read"], res["other_local"] = reader.bytes_read, _local_bytes(back)

    # resharded into 2 and 3 of the ranks (their own group and mesh)
    for n in (2, 3):
        sub = DeviceMesh("cpu", list(range(n)))   # every rank takes part in making it
        if rank < n:
            back = _dstate(sub, ROWS_PL, zeros=True)
            reader = kd.KilnStorageReader(ckpt)
            dcp.load(back, storage_reader=reader, process_group=sub.get_group())
            res["bad"] += ["sub%d:%s" % (n, k) for k in _check_local(back, sub, ROWS_PL)]
            res["sub%d_read" % n], res["sub%d_local" % n] = reader.bytes_read, \
                _local_bytes(back)
        dist.barrier()

    # a second folder: a save, then an async save replacing it
    dcp.save(sd, storage_writer=kd.KilnStorageWriter(ckpt2))
    sd2 = _dstate(mesh, SAVE_PL, shift=1)
    sd2.update(_extras(1))
    dcp.async_save(sd2, storage_writer=kd.KilnStorageWriter(
        ckpt2, enable_consolidation=True, consolidated_path=set2, max_shard_size=5000)).result()
    return res


def _sc_fsdp(rank, world, out, ckpt):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))

    def model_and_opt():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 5))   # 5 rows on 2 ranks: uneven
        for layer in (m[0], m[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m, torch.optim.AdamW(m.parameters(), lr=0.1)

    m, opt = model_and_opt()
    torch.manual_seed(1 + rank)
    m(torch.randn(4, 8)).square().sum().backward()
    opt.step()
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, storage_writer=kd.KilnStorageWriter(ckpt))

    def full(d):   # DCP's own gather (full_tensor) of every tensor: the oracle
        out_ = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out_[k] = full(v)
            elif isinstance(v, torch.Tensor):
                out_[k] = v.full_tensor() if hasattr(v, "full_tensor") else v.clone()
            elif isinstance(v, list):
                out_[k] = [full(x) if isinstance(x, dict) else x for x in v]
            else:
                out_[k] = v
        return out_

    want = {"model": full(msd), "optim": full(osd)}
    if rank == 0:
        torch.save(want, os.path.join(out, "expected.pt"))

    m2, opt2 = model_and_opt()   # fresh, never stepped
    msd2, osd2 = get_state_dict(m2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, storage_reader=kd.KilnStorageReader(ckpt))
    set_state_dict(m2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = {"model": full(get_state_dict(m2, opt2)[0]), "optim": full(get_state_dict(m2, opt2)[1])}
    bad = []

    def cmp(a, b, where):
        if isinstance(a, dict):
            if sorted(map(str, a)) != sorted(map(str, b)):
                bad.append(where + ":keys")
            for k in a:
                cmp(a[k], b.get(k), "%s.%s" % (where, k))
        elif isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor) or not _same(a, b):
                bad.append(where)
        elif isinstance(a, list):
            for i, (x, y) in enumerate(zip(a, b)):
                cmp(x, y, "%s[%d]" % (where, i))
        elif a != b:
            bad.append(where)

    cmp(want, got, "")
    return {"bad": bad}




def _sc_kill(rank, world, out, ckpt, step, victim, shift):
    """Save; the victim rank SIGKILLs itself at ``step`` of the save."""
    import kiln.torch.distributed as kdist

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    me = rank == victim

    class Writer(kdist.KilnStorageWriter):
        def prepare_local_plan(self, plan):
            if me and step == "plan":
                die()
            return super().prepare_local_plan(plan)

        def write_data(self, plan, planner):
            fut = super().write_data(plan, planner)
            if me and step == "written":   # this rank's file is complete, in place
                die()
            return fut

        def finish(self, metadata, results):
            if me and step == "finish":   # every rank's file complete, no commit
                die()
            super().finish(metadata, results)

    if me and step == "write":   # half way through this rank's file
        real = kiln.TensorWriter.write
        count = [0]

        def write(self, name, data):
            count[0] += 1
            if count[0] == 3:
                die()
            return real(self, name, data)

        kiln.TensorWriter.write = write
    if me and step == "commit":   # the commit record written and fsynced, not renamed
        real_replace = os.replace

        def replace(src, dst, *a, **k):
            if os.path.basename(dst) == kd.COMMIT_NAME:
                die()
            return real_replace(src, dst, *a, **k)

        os.replace = replace
    if me and step == "committed":   # the commit renamed, the replaced files not removed
        kdist._drop_replaced = lambda folder, tag: die()
    mesh = init_device_mesh("cpu", (world,))
    sd = _dstate(mesh, SAVE_PL, shift)
    sd.update(_extras(shift))
    dcp.save(sd, storage_writer=Writer(ckpt))
    return {}


SCENARIOS = {"dtensor": _sc_dtensor, "fsdp": _sc_fsdp, "kill": _sc_kill}


# --- in the test process: one rank, no group ---------------------------------------------

def _load1(ckpt, shift=0):
    """The checkpoint loaded by one process (DCP without a group), compared
    with the oracle; the list of differing names."""
    want = _full(shift)
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    sd.update({"step": 0, "sched": {"lr": 0.0, "name": ""}})
    dcp.load(sd, storage_reader=kd.KilnStorageReader(ckpt), no_dist=True)
    bad = [k for k in want if not _same(sd[k], want[k])]
    if sd["step"] != _extras(shift)["step"] or sd["sched"] != _extras(shift)["sched"]:
        bad.append("extras")
    return bad


def _save1(ckpt, shift=0, checksum=False):
    sd = dict(_full(shift))
    sd.update(_extras(shift))
    dcp.save(sd, storage_writer=kd.KilnStorageWriter(ckpt, checksum=checksum), no_dist=True)


def _refused(ckpt, shift=0):
    """What DCP's load raises (a CheckpointException), and the reader's own
    refusal (its ``read_metadata``, which DCP turns into an assertion)."""
    with pytest.raises(CheckpointException) as e:
        _load1(ckpt, shift)
    own = None
    try:
        kd.KilnStorageReader(ckpt).read_metadata()
    except Exception as x:
        own = x
    return e.value, e.value.failures[0][0], own


def _rank_files(ckpt):
    return sorted(n for n in os.listdir(ckpt) if n.startswith("dcp-"))


# --- tests -------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_four_ranks_save_reshard_async_consolidate(api, tmp_path):
    ckpt, ckpt2, set2 = str(tmp_path / "ckpt"), str(tmp_path / "ckpt2"), str(tmp_path / "set2")
    codes, results, errors = _launch(tmp_path, "dtensor", 4, ckpt=ckpt, ckpt2=ckpt2, set2=set2)
    _ok(codes, results, errors, api)
    for r, res in results.items():
        assert res["bad"] == [], (r, res["bad"])
        # each rank read only its own chunks' bytes where the boxes are row blocks
        assert res["same_read"] == res["same_local"], r
        if r < 2:
            assert res["sub2_read"] == res["sub2_local"], r
        if r < 3:
            assert res["sub3_read"] == res["sub3_local"], r
    total = sum(_nbytes(v) for v in _full().values())
    # every rank reads its replica of "rep" (stored once), nothing else twice
    assert sum(res["same_read"] for res in results.values()) == total + 3 * _nbytes(_full()["rep"])

    # one file per rank and the commit; the replicated tensor written once
    names = _rank_files(ckpt)
    assert len(names) == 4 and sorted(os.listdir(ckpt)) == sorted(names + [kd.COMMIT_NAME])
    stored, reps, entries = 0, 0, 0
    for n in names:
        with kiln.open(os.path.join(ckpt, n)) as f:
            for k in f.keys():
                if k.split("@")[0] in _full():
                    stored += f[k].nbytes
                else:
                    entries += f[k].nbytes   # the pickled non-tensor entries
                reps += k == "rep"
    assert reps == 1 and stored == total
    # a reshard (other placements) reads the boxes it needs and nothing more
    for res in results.values():
        assert res["other_read"] == res["other_local"] + entries

    # one process, no group: the whole state, bit for bit
    assert _load1(ckpt) == []

    # the async save replaced the first save of ckpt2 whole
    assert _load1(ckpt2, shift=1) == []
    assert len(_rank_files(ckpt2)) == 4 and not set(_rank_files(ckpt2)) & set(names)

    # consolidated: an ordinary set every kiln reader takes
    index = kd.consolidate(ckpt, str(tmp_path / "set"), max_shard_size=2000)
    got = kiln.torch.load_file(index)
    want = _full()
    assert sorted(got) == sorted(want)
    assert all(_same(got[k], want[k]) for k in want)
    with kiln.open(str(tmp_path / "set")) as s:
        assert sorted(s.keys()) == sorted(want)
    meta = json.loads(open(index).read())["metadata"]
    assert meta["dcp.entries"] == ["sched.lr", "sched.name", "step"]
    assert meta["total_size"] == total
    assert kiln.cli.main(["check", index]) == 0

    # the writer's own consolidation (after the async save's commit)
    got = kiln.torch.load_file(os.path.join(set2, "model.kiln.index.json"))
    want = _full(1)
    assert sorted(got) == sorted(want) and all(_same(got[k], want[k]) for k in want)
    assert len([n for n in os.listdir(set2) if n.endswith(".kiln")]) == 2   # "big" alone


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fsdp2_two_ranks_with_adamw(api, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    codes, results, errors = _launch(tmp_path, "fsdp", 2, ckpt=ckpt)
    _ok(codes, results, errors, api)
    assert results[0]["bad"] == [] and results[1]["bad"] == []
    want = torch.load(str(next(tmp_path.glob("run-fsdp-*")) / "expected.pt"))
    got = {"model": {k: torch.zeros_like(v) for k, v in want["model"].items()},
           "optim": {"state": {k: {s: torch.zeros_like(x) if isinstance(x, torch.Tensor) else x
                                   for s, x in st.items()}
                               for k, st in want["optim"]["state"].items()},
                     "param_groups": want["optim"]["param_groups"]}}
    dcp.load(got, storage_reader=kd.KilnStorageReader(ckpt), no_dist=True)
    for k, v in want["model"].items():
        assert _same(got["model"][k], v), k
    for k, st in want["optim"]["state"].items():
        for s, x in st.items():
            assert _same(got["optim"]["state"][k][s], x), (k, s)
    assert len(_rank_files(ckpt)) == 2


KILLS = [("plan", 1), ("write", 1), ("written", 0), ("finish", 0), ("commit", 0),
         ("committed", 0)]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_rank_killed_at_each_step_of_a_save_leaves_the_previous_checkpoint(api, tmp_path):
    # one group of 2 ranks per step, all at once (each in its own folder)
    groups = []
    try:
        for step, victim in KILLS:
            ckpt = str(tmp_path / ("ckpt-" + step))
            _save1(ckpt)   # the previous checkpoint (one process)
            groups.append((step, victim, ckpt, _rank_files(ckpt),
                           _start(tmp_path, "kill", 2, ckpt=ckpt, step=step, victim=victim,
                                  shift=1)))
    finally:
        done = [(g[:4], _finish(g[4])) for g in groups]
    for (step, victim, ckpt, before), (codes, _, errors) in done:
        assert codes[victim] == -signal.SIGKILL, step
        assert codes[1 - victim] == 1 and "Traceback" in errors[1 - victim], step   # raised
        left = [n for n in os.listdir(ckpt) if n not in before + [kd.COMMIT_NAME]]
        if step == "committed":   # the new commit is in: the new checkpoint, whole
            assert _load1(ckpt, shift=1) == [], step
        else:
            assert _load1(ckpt) == [], step
            assert bool(left) == (step != "plan"), (step, left)   # what the dead save left
        _save1(ckpt, shift=2)   # the next save removes it
        assert _load1(ckpt, shift=2) == [], step
        assert not set(left) & set(os.listdir(ckpt)), step
        assert len(_rank_files(ckpt)) == 1, step
        assert not [n for n in os.listdir(ckpt) if n.endswith(".kiln-tmp")], step


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_save_killed_before_its_commit_is_refused_naming_what_is_missing(api, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    codes, _, _ = _launch(tmp_path, "kill", 2, ckpt=ckpt, step="write", victim=1, shift=0)
    assert codes[1] == -signal.SIGKILL
    names = _rank_files(ckpt)
    assert len(names) == 1 and names[0].endswith("-00000.kiln")
    missing = names[0].replace("-00000.kiln", "-00001.kiln")
    outer, _, own = _refused(ckpt)
    assert isinstance(own, kd.IncompleteCheckpointError)
    assert own.missing == [kd.COMMIT_NAME, missing]
    assert "the files of rank 1 are missing" in str(own)
    assert kd.COMMIT_NAME in str(outer) and "rank 1 are missing" in str(outer)


# --- one process: what a reader refuses ------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_committed_file_missing_or_changed_is_refused(api, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _save1(ckpt, checksum=True)
    (name,) = _rank_files(ckpt)
    path = os.path.join(ckpt, name)
    raw = open(path, "rb").read()
    os.remove(path)
    outer, _, own = _refused(ckpt)
    assert isinstance(own, kd.IncompleteCheckpointError)
    assert own.missing == [name] and name in str(outer)
    with open(path, "wb") as f:   # same size, one payload byte changed: the CRC-32
        f.write(raw)
    with kiln.open(path) as f:
        at = kiln._access.file_offset(kiln._access.table(f)["w0"])
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))
    _, inner, own = _refused(ckpt)
    assert own is None   # the commit is whole: the chunk's read finds the fault
    assert isinstance(inner, kiln.KilnError) and inner.code == "CHECKSUM"
    with pytest.raises(kiln.KilnError) as e:   # and so does consolidation, before its copy
        kd.consolidate(ckpt, str(tmp_path / "new" / "set"))
    assert e.value.code == "CHECKSUM" and "'w0'" in str(e.value)
    assert not os.path.exists(tmp_path / "new")   # the folders it made are taken away
    os.mkdir(tmp_path / "set")   # a folder that was there stays, with what it held
    (tmp_path / "set" / "note.txt").write_text("kept")
    with pytest.raises(kiln.KilnError):
        kd.consolidate(ckpt, str(tmp_path / "set"))
    assert sorted(os.listdir(tmp_path / "set")) == ["note.txt"]
    with open(path, "ab") as f:   # another size than committed
        f.write(b"\0")
    _, _, own = _refused(ckpt)
    assert isinstance(own, kd.IncompleteCheckpointError) and own.missing == [name]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_damaged_commit_record_is_refused(api, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _save1(ckpt)
    commit = os.path.join(ckpt, kd.COMMIT_NAME)
    rec = json.loads(open(commit).read())
    rec["tensors"]["w0"]["chunks"][0][1] = [11, 6]   # a chunk past its tensor
    with open(commit, "w") as f:
        json.dump(rec, f)
    outer, _, own = _refused(ckpt)
    assert isinstance(own, kiln.KilnError) and own.code == "FRAME"
    assert "outside its size" in str(own) and "outside its size" in str(outer)
    with open(commit, "wb") as f:
        f.write(b'{"format": "kiln-dcp", "version": 1, "files": {"x": NaN}}')
    _, _, own = _refused(ckpt)
    assert isinstance(own, kiln.KilnError) and own.code == "FRAME"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_that_overlap_or_leave_a_hole_are_refused(api, tmp_path):
    """A commit record whose chunks of a tensor overlap (however their element
    counts add up) or leave part of it uncovered is FRAME naming the tensor,
    for the reader and for consolidate: neither may hand out memory that no
    chunk wrote."""
    ckpt = str(tmp_path / "ckpt")
    _save1(ckpt)
    commit = os.path.join(ckpt, kd.COMMIT_NAME)
    good = json.loads(open(commit).read())
    (rows, cols), (off, sz, file, name) = good["tensors"]["w0"]["size"], \
        good["tensors"]["w0"]["chunks"][0]
    assert rows >= 2 and cols >= 2 and off == [0, 0] and sz == [rows, cols]
    cases = {
        # a column and a row: as many elements as the tensor, one shared, one missing
        "overlap": [[[0, 0], [rows, 1], file, name], [[rows - 1, 0], [1, cols], file, name]],
        "hole": [[[0, 0], [rows - 1, cols], file, name]],
    }
    for words, chunks in cases.items():
        rec = json.loads(json.dumps(good))
        rec["tensors"]["w0"]["chunks"] = chunks
        with open(commit, "w") as f:
            json.dump(rec, f)
        _, _, own = _refused(ckpt)
        assert isinstance(own, kiln.KilnError) and own.code == "FRAME", (words, own)
        assert "'w0'" in str(own) and (words == "hole" or "overlap" in str(own)), str(own)
        with pytest.raises(kiln.KilnError) as e:
            kd.consolidate(ckpt, str(tmp_path / ("set-" + words)))
        assert e.value.code == "FRAME" and "'w0'" in str(e.value)


def test_writer_and_reader_contract_odds(tmp_path):
    assert kd.KilnStorageWriter.validate_checkpoint_id(str(tmp_path))
    assert not kd.KilnStorageWriter.validate_checkpoint_id("s3://bucket/ckpt")
    assert not kd.KilnStorageReader.validate_checkpoint_id(str(tmp_path))   # no commit
    assert not kd.KilnStorageReader.validate_checkpoint_id("s3://bucket/ckpt")
    (tmp_path / kd.COMMIT_NAME).write_text("{}")   # a commit record: the reader's id
    assert kd.KilnStorageReader.validate_checkpoint_id(str(tmp_path))
    assert kd.KilnStorageReader(str(tmp_path)).checkpoint_id == str(tmp_path)
    os.remove(tmp_path / kd.COMMIT_NAME)
    with pytest.raises(TypeError):   # (bytes are a path, as everywhere: test_safetensors_calls)
        kd.KilnStorageWriter(42)
    with pytest.raises(TypeError, match="contents"):
        kd.KilnStorageWriter(b"ck\0pt")
    with pytest.raises(ValueError):
        kd.KilnStorageWriter(str(tmp_path), thread_count=0)
    w = kd.KilnStorageWriter(str(tmp_path / "a"))
    meta = w.storage_meta()
    assert meta.checkpoint_id == str(tmp_path / "a") and meta.save_id
    w.reset(str(tmp_path / "b"))
    assert w.checkpoint_id == str(tmp_path / "b") and w.storage_meta().save_id != meta.save_id
