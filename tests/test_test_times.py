"""scripts/test_times.py: a JUnit report's test time, totalled by module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test_times.py"
spec = importlib.util.spec_from_file_location("test_times", SCRIPT)
test_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_times)

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two[x]" time="2.0"><skipped/></testcase>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="0.5"/>
<testcase classname="tests.test_b" name="test_four" time=""/>
</testsuite></testsuites>"""


def test_totals_by_module_with_classes_folded_into_their_module(tmp_path, capsys):
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    totals, overall = test_times.module_totals(report)
    assert totals == {"tests.test_a": (3.5, 2), "tests.test_b": (0.5, 2)} and overall == 4.0
    assert test_times.main([str(report), "--top", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and printed[1].split()[-1] == "tests.test_a" and "87.5%" in printed[1]


def test_a_missing_report_exits_2(tmp_path, capsys):
    assert test_times.main([str(tmp_path / "none.xml")]) == 2
    assert "no report" in capsys.readouterr().err
