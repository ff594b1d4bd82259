"""tools/stress_readers.py for a few seconds (issue 51, item 8): readers of
every kind against files that another process truncates, extends, rewrites in
place and replaces meanwhile; no reader may die by a signal.  The closing
note of the issue reports a ten-minute run of the same tool."""

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
    kinds = {k.split(".")[0] for k in report["calls"]}
    assert {"open", "records", "copies", "refused"} <= kinds, report["calls"]
    assert set(report["mutations"]) == {"truncate", "extend", "rewrite", "replace", "restore"}
    assert min(report["mutations"].values()) > 10 and report["calls"]["refused.KilnError"] > 10
    # every refusal is a KilnError that says what changed (the tool lists others by message)
    assert [k for k in report["calls"] if k.startswith("other")] == []
