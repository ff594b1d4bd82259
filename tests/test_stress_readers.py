"""tools/stress_readers.py for a few seconds (issue 51, item 8): readers of
every kind against files that another process truncates, extends, rewrites in
place and replaces meanwhile; no reader may die by a signal.  And against
files another process saves generation after generation (issue 56 item 15):
every value a reader call returns is exactly one generation (the tool's
oracle: each generation's values say which it is), never a mix.  The closing
notes of the issues report ten-minute runs of the same tool."""

import json
import os
import subprocess
import sys

from _util import ROOT

TOOL = os.path.join(ROOT, "tools", "stress_readers.py")


def test_readers_of_every_kind_survive_files_changing_under_them(tmp_path):
    if not os.path.exists(TOOL):
        import pytest
        pytest.skip("no tools/ here (an installed-wheel run)")
    r = subprocess.run([sys.executable, TOOL, "--seconds", "4", "--readers", "2",
                        "--folder", str(tmp_path), "--json", str(tmp_path / "report.json")],
                       capture_output=True, text=True, timeout=180)
    with open(tmp_path / "report.json") as f:
        report = json.load(f)
    assert report["crashes"] == [] and r.returncode == 0, (report["crashes"], r.stderr[-2000:])
    assert report["wrong"] == [] and "wrong" not in report["calls"], report["wrong"]
    kinds = {k.split(".")[0] for k in report["calls"]}
    assert {"open", "records", "copies", "refused", "gens"} <= kinds, report["calls"]
    assert report["generations"] >= 2   # the readers met files replaced under them
    assert set(report["mutations"]) == {"truncate", "extend", "rewrite", "replace", "restore"}
    assert min(report["mutations"].values()) > 10 and report["calls"]["refused.KilnError"] > 10
    # every refusal is a KilnError that says what changed (the tool lists others by message)
    assert [k for k in report["calls"] if k.startswith("other")] == []
