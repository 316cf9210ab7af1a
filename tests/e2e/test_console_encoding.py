"""On a console that is not UTF-8 (Windows' cp1252 when output is redirected; PYTHONIOENCODING=ascii) the report's
marks, sparklines and other glyphs are written as their fallbacks: no UnicodeEncodeError, no mojibake."""

import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from theinference.bundled import data_dir
from theinference.cli.consoles import GLYPHS, console_for, encodable
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.report.tables import sparkline

ERRORS = [1e-7, 3e-6, 2e-5, 4e-4, 1e-3, 8e-2, 0.5, 2.0, float("nan"), 0.0]


def _console_output(encoding: str, text: str) -> bytes:
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, newline="\n")
    console_for(stream, width=80).print(text, markup=False)
    stream.flush()
    return raw.getvalue()


@pytest.mark.parametrize("encoding", ["cp1252", "ascii", "cp437"])
def test_a_sparkline_falls_back_whole_to_the_reports_own_ascii_ramp(encoding):
    """cp437 has two of the eight blocks: one sparkline still never mixes the two ramps."""
    written = _console_output(encoding, f"error by position: {sparkline(ERRORS)}")
    assert written.decode(encoding) == f"error by position: {sparkline(ERRORS, plain=True)}\n"


def test_glyphs_an_encoding_has_are_kept_and_any_other_character_is_a_question_mark():
    assert encodable("✔ forward · 3/3 cases — 1.5× ≤ Δ", "cp1252") == "+ forward · 3/3 cases — 1.5× <= d"
    assert encodable("✔ forward · 3/3 cases — 1.5× ≤ Δ", "utf-8") == "✔ forward · 3/3 cases — 1.5× ≤ Δ"
    assert encodable("KeyError: 'clé' ☃ in C:\\Users\\José", "ascii") == "KeyError: 'cl?' ? in C:\\Users\\Jos?"


def _cli(encoding: str, *args, cwd) -> tuple[int, bytes, str]:
    done = subprocess.run(
        [sys.executable, "-m", "theinference", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "PYTHONIOENCODING": encoding},
        capture_output=True,
    )
    return done.returncode, done.stdout, done.stderr.decode(encoding, "replace")


def _no_mojibake(text: str) -> None:
    """Every character beyond ASCII is a glyph the report prints that this encoding has (·, —, …), none a stray."""
    assert {c for c in text if ord(c) > 127} <= set(GLYPHS), {c for c in text if ord(c) > 127}


@pytest.mark.slow
def test_a_passing_and_a_failing_report_in_cp1252(tmp_path, solution_course, tiny_path):
    code, out, err = _cli(
        "cp1252", "test", "--stage", "forward", "--course", solution_course, "--weights", tiny_path, cwd=tmp_path
    )
    text = out.decode("cp1252")
    assert code == 0 and "Traceback" not in err, err
    assert "\n+ forward  Forward pass" in text and "1 of 1 stage(s) passed · 10/10 points" in text
    assert "\n-> next stage: single-step-attention" in text
    _no_mojibake(text)

    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == "forward-no-causal-mask")
    bug = build_mutant(mutant, data_dir("course") / "solution", tmp_path / "bug")
    code, out, err = _cli("cp1252", "test", "--stage", "forward", "--course", bug, "--weights", tiny_path, cwd=tmp_path)
    text = out.decode("cp1252")
    assert code == 1 and "Traceback" not in err, err
    assert "\nx forward  Forward pass" in text and "failed · 1/3 cases" in text
    assert "max |d|" in text and "| < first" in text  # the divergence table's header and first bad row
    sparklines = [line.split(": ", 1)[1] for line in text.splitlines() if "error by position: " in line]
    assert sparklines and all(set(s) <= set("_.-:=+*#x") for s in sparklines), sparklines
    _no_mojibake(text)


@pytest.mark.slow
def test_a_failing_report_on_an_ascii_console_and_junit_on_cp1252(tmp_path, tiny_path):
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == "forward-no-causal-mask")
    bug = build_mutant(mutant, data_dir("course") / "solution", tmp_path / "bug")
    args = ("test", "--stage", "forward", "--course", bug, "--weights", tiny_path, "--no-diagnosis")
    code, out, err = _cli("ascii", *args, cwd=tmp_path)
    assert code == 1 and "Traceback" not in err, err
    text = out.decode("ascii")  # nothing beyond ASCII, or this raises
    assert "\nx forward  Forward pass" in text and "failed - 1/3 cases" in text and "| < first" in text

    # A document a program reads keeps its own encoding, UTF-8, whatever the console's: JUnit's XML says so.
    code, out, err = _cli("cp1252", *args, "--format", "junit", cwd=tmp_path)
    assert code == 1 and "Traceback" not in err, err
    assert out.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    failures = [f.get("message", "") for f in ET.fromstring(out).iter("failure")]
    assert any("max |Δ|" in message for message in failures), failures
