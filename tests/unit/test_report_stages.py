"""report/stages.py: `theinference stages list`, a line per stage and its title below, at any width."""

from rich.cells import cell_len

from theinference.report.stages import INDENT, StageLine, stage_lines

from .builders import check_snapshot

ROWS = [
    StageLine("forward", "pass", "The whole forward pass, all at once", "run_forward", 4, 10),
    StageLine("prove-one-layer", "fail ◀ next", "Prove one layer: attention with a cache", "run_layer_equiv", 3, 10),
    StageLine("greedy", "", "Greedy generation with the cache", "run_greedy", 2, 7.5, defined_in="greedy.toml"),
]


def test_snapshot_wide_and_narrow():
    text = "\n".join(stage_lines(ROWS, 100)) + "\n\n" + "\n".join(stage_lines(ROWS, 40)) + "\n"
    check_snapshot("stages_list_100_and_40.txt", text)


def test_wide_lines_have_the_adapter_inline():
    lines = stage_lines(ROWS, 100)
    assert lines[0].split() == ["stage", "status", "cases", "points", "adapter"]
    assert lines[1].split() == ["forward", "pass", "4", "10", "run_forward"]
    assert lines[2] == INDENT + "The whole forward pass, all at once"
    assert lines[3].split()[:4] == ["prove-one-layer", "fail", "◀", "next"]


def test_points_are_shown_as_short_numbers():
    greedy = next(line for line in stage_lines(ROWS, 100) if line.startswith("greedy"))
    assert greedy.split()[1:3] == ["2", "7.5"]


def test_a_stage_not_built_in_says_which_file_defined_it():
    assert INDENT + "Greedy generation with the cache · from greedy.toml" in stage_lines(ROWS, 100)


def test_at_a_narrow_width_the_adapter_moves_to_the_title_line_and_ids_stay_whole():
    lines = stage_lines(ROWS, 40)
    assert "adapter" not in lines[0]
    assert any(line.split()[0] == "prove-one-layer" for line in lines)  # never cut
    titles = " ".join(line.strip() for line in lines if line.startswith(INDENT))
    assert "run_layer_equiv()" in titles and "run_greedy() · from greedy.toml" in titles
    assert all(cell_len(line) <= 40 for line in lines if line.startswith(INDENT))


def test_a_long_title_wraps_under_itself_as_words():
    long = StageLine("x", "", "word " * 30, "run_x", 1, 1)
    lines = stage_lines([long], 60)
    wrapped = [line for line in lines if line.startswith(INDENT)]
    assert len(wrapped) > 1 and all(cell_len(line) <= 60 for line in wrapped)
    assert all(line[len(INDENT)] != " " for line in wrapped)


def test_columns_line_up_with_wide_characters():
    """Status glyphs and CJK titles take their terminal cells, not their code points: columns still align."""
    rows = [StageLine("a", "pass ✓", "t", "run_a", 1, 1), StageLine("bb", "全部", "t", "run_b", 22, 10)]
    lines = [line for line in stage_lines(rows, 100) if not line.startswith(INDENT)]
    adapters = [cell_len(line[: line.index("run_")]) for line in lines[1:]]
    assert adapters[0] == adapters[1]
