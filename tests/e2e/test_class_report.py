"""`theinference report`: the class report from a real `grade` run over the solution and three mutants."""

import json
import os
import shutil
import statistics
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import write_adapters, write_quick_scaling_stage
from test_scaling import RECOMPUTE
from theinference.bundled import data_dir
from theinference.cli.app import app
from theinference.grading.tools.mutants import build_mutant, load_mutant

MUTANTS = ("decode-wpe-off-by-one", "wpe-base-off-by-one", "missing-attn-scale")
STAGES = ("prove-one-layer", "decode-step")  # a stage diagnosed per case, and one diagnosed across cases


class Elements(HTMLParser):
    """Every element's tag and attributes, the ids, the hrefs and the text, as a browser's DOM would hold them."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def with_class(self, name: str) -> list[dict]:
        return [a for _, a in self.elements if name in (a.get("class") or "").split()]

    def ids(self) -> set[str]:
        return {a["id"] for _, a in self.elements if "id" in a}

    def hrefs(self) -> list[str]:
        return [a["href"] for tag, a in self.elements if tag == "a" and "href" in a]


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tiny_path) -> Path:
    """grades.json of `grade --format json` over the solution and three mutants, on two stages."""
    root = tmp_path_factory.mktemp("class")
    solution = data_dir("course") / "solution"
    shutil.copytree(solution, root / "subs" / "solution")
    for name in MUTANTS:
        build_mutant(
            load_mutant(data_dir("course") / "mutants" / name / "manifest.toml"), solution, root / "subs" / name
        )
    stages = [arg for s in STAGES for arg in ("--stage", s)]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("THEINFERENCE_CACHE", str(root / "cache"))
        env.delenv("CI", raising=False)
        subs = sorted(str(p) for p in (root / "subs").iterdir())
        out = root / "grades.json"
        result = CliRunner().invoke(
            app, ["grade", *subs, "--weights", str(tiny_path), *stages, "--format", "json", "--out", str(out)]
        )
    assert result.exit_code == 0, result.output
    return out


def make_report(cli, batch: Path, tmp_path: Path) -> tuple[Path, Elements]:
    out = tmp_path / "report.html"
    result = cli("report", batch, "--out", out)
    assert result.exit_code == 0, result.output
    return out, Elements(out.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_report_counts_match_the_batch_json(cli, batch, tmp_path):
    doc = json.loads(batch.read_text())
    out, page = make_report(cli, batch, tmp_path)

    # per-stage pass rates, as the JSON has them
    rates = {a["data-stage"]: (int(a["data-passed"]), int(a["data-total"])) for a in page.with_class("stage-rate")}
    expected = {
        stage: (
            sum(
                any(s["id"] == stage and s["status"] == "pass" for s in sub["results"]["stages"])
                for sub in doc["submissions"]
            ),
            len(doc["submissions"]),
        )
        for stage in STAGES
    }
    assert rates == expected == {"prove-one-layer": (2, 4), "decode-step": (2, 4)}

    # the distribution of points holds every submission once, in the bin of its points
    bins = page.with_class("bin")
    assert sum(int(b["data-count"]) for b in bins) == len(doc["submissions"])
    for sub in doc["submissions"]:
        assert any(
            float(b["data-low"]) <= sub["points"] <= float(b["data-high"]) and int(b["data-count"]) for b in bins
        )

    # the class-wide findings: each bug, how many students the JSON's diagnoses name it for
    named: dict[str, set] = {}
    for sub in doc["submissions"]:
        for stage in sub["results"]["stages"]:
            for bug in filter(None, ((stage["diagnosis"] or {}).get("bug") or "").split(", ")):
                named.setdefault(bug, set()).add(sub["id"])
    findings = {a["data-bug"]: int(a["data-students"]) for a in page.with_class("finding-row")}
    assert findings == {bug: len(ids) for bug, ids in named.items()}
    assert findings == {"wpe-off-by-one": 2, "missing-scale": 1}

    # every link resolves to a section of the page: a section per submission, one per stage graded
    ids = page.ids()
    assert all(href[1:] in ids for href in page.hrefs() if href.startswith("#"))
    assert len(page.with_class("submission")) == 4 and len(page.with_class("stage")) == 4 * len(STAGES)
    text = "".join(page.text)
    assert "finding: wpe-off-by-one" in text and "hint:" in text and "across 10 cases" in text
    # an error-by-position plot per failing case (decode-step: one across its cases)
    assert len(page.with_class("error-plot")) >= 3
    # the TA's grid: a row per submission, a cell per stage with the JSON's status, linked to that stage's section
    grid = {a["data-submission"]: a for a in page.with_class("grid-row")}
    assert sorted(grid) == sorted(s["id"] for s in doc["submissions"])
    cells = [(a["data-stage"], a["data-status"]) for a in page.with_class("cell")]
    assert cells == [(st["id"], st["status"]) for sub in doc["submissions"] for st in sub["results"]["stages"]]
    for sub in doc["submissions"]:
        assert float(grid[sub["id"]]["data-seconds"]) == pytest.approx(sub["seconds"], abs=0.01)
        assert {f"#s-{sub['id']}--{stage}" for stage in STAGES} <= set(page.hrefs())
    stats = page.with_class("point-stats")[0]
    points = [s["points"] for s in doc["submissions"]]
    assert float(stats["data-median"]) == statistics.median(points)
    assert float(stats["data-stdev"]) == pytest.approx(statistics.pstdev(points), rel=1e-5)
    # every mutant is the reference solution with one edit: each is flagged as its copy, with the passages shown
    flagged = {(a["data-submission"], a["data-of"]) for a in page.with_class("copy-row")}
    assert flagged == {(s["id"], "reference-solution") for s in doc["submissions"]}
    assert len(page.with_class("region")) >= len(doc["submissions"])

    # self-contained: nothing fetched, no script
    html = out.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_report_refuses_what_is_not_a_batch(cli, tmp_path):
    single = tmp_path / "results.json"
    single.write_text(json.dumps({"schema": "theinference.results", "stages": []}))
    result = cli("report", single, "--out", tmp_path / "r.html")
    assert result.exit_code == 2 and "results.json" in result.stderr and "'schema'" in result.stderr
    assert not (tmp_path / "r.html").exists()
    broken = tmp_path / "grades.json"
    broken.write_text("{not json")
    result = cli("report", broken, "--out", tmp_path / "r.html")
    assert result.exit_code == 2 and "not a JSON document" in result.stderr


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(cli, batch, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no headless browser here (Debian: apt-get install chromium)")
    out, page = make_report(cli, batch, tmp_path)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    flags += ["--enable-logging=stderr", "--v=0", "--window-size=1200,2400"]
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = Elements(dom.stdout)
    assert {a["data-bug"]: a["data-students"] for a in rendered.with_class("finding-row")} == {
        "wpe-off-by-one": "2",
        "missing-scale": "1",
    }
    assert len(rendered.with_class("error-plot")) == len(page.with_class("error-plot"))
    assert "CONSOLE" not in dom.stderr  # the page logs nothing: no error, no blocked fetch
    shot = tmp_path / "report.png"
    done = subprocess.run([*flags, f"--screenshot={shot}", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert "CONSOLE" not in done.stderr
    assert len(rendered.with_class("grid-row")) == 4 and len(rendered.with_class("copy-row")) == 4
    artefacts = os.environ.get("THEINFERENCE_TEST_ARTEFACTS")  # where CI keeps the screenshot for a person to look at
    if artefacts:
        shutil.copy(shot, Path(artefacts) / "class-report.png")


@pytest.fixture(scope="module")
def scaling_batch(tmp_path_factory, tiny_path, proof_cache) -> Path:
    """grades.json of `grade --format json` over the solution and a recompute, on cache-scaling (test-sized)."""
    root = tmp_path_factory.mktemp("class-scaling")
    shutil.copytree(data_dir("course") / "solution", root / "subs" / "solution")
    write_adapters(root / "subs" / "recompute", RECOMPUTE)
    stages_dir = write_quick_scaling_stage(root / "quick-stages")
    out = root / "grades.json"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("THEINFERENCE_CACHE", str(proof_cache))
        env.delenv("CI", raising=False)
        subs = [str(root / "subs" / "solution"), str(root / "subs" / "recompute")]
        args = ["grade", *subs, "--weights", str(tiny_path), "--stages-dir", str(stages_dir)]
        result = CliRunner().invoke(app, [*args, "--stage", "quick-scaling", "--format", "json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_report_shows_cache_scaling_figures_and_counts_no_cache_across_the_class(cli, scaling_batch, tmp_path):
    doc = json.loads(scaling_batch.read_text())
    out, page = make_report(cli, scaling_batch, tmp_path)
    scaling = {
        sub["id"]: stage["cases"][0]["scaling"] for sub in doc["submissions"] for stage in sub["results"]["stages"]
    }
    # a row per timed length for each submission, the stopped call marked as a lower bound
    rows = page.with_class("scaling-row")
    assert [int(r["data-tokens"]) for r in rows] == [n for t in scaling.values() for n in t["lengths"]]
    stopped = [int(r["data-tokens"]) for r in rows if r["data-stopped"] == "true"]
    assert stopped == [t["stopped_at"] for t in scaling.values() if t["stopped_at"] is not None] == [320]
    text = " ".join("".join(page.text).split())
    assert "(stopped)" in text and text.count("(b) 320 tokens cost") == 2 and "× faster" in text
    assert text.count("counted by the grader (") == 2 and "synthetic 'proof' preset" in text
    # the class-wide table counts the recompute under its shape: no bug is named for cache-scaling
    shapes: dict[str, set] = {}
    for sub in doc["submissions"]:
        for stage in sub["results"]["stages"]:
            if stage["status"] == "fail" and stage["diagnosis"]:
                shapes.setdefault(stage["diagnosis"]["shape"], set()).add(sub["id"])
    found = {a["data-shape"]: int(a["data-students"]) for a in page.with_class("finding-row")}
    assert found == {shape: len(ids) for shape, ids in shapes.items()} == {"no-cache": 1}
    assert all(href[1:] in page.ids() for href in page.hrefs() if href.startswith("#"))
