"""files.py: every file the grader writes is written whole, and never through a link planted at its name."""

import os
import stat

import pytest

from theinference.files import OutputBlocked, atomic_file, check_target, write_atomic


@pytest.fixture
def out(tmp_path):
    """A directory of its own (tmp_path also holds the isolated home)."""
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def test_text_and_bytes_are_written_whole_with_their_mode(out):
    write_atomic(out / "a.json", "{}\n")
    write_atomic(out / "b.bin", b"\x00\xff", mode=0o600)
    assert (out / "a.json").read_text() == "{}\n" and (out / "b.bin").read_bytes() == b"\x00\xff"
    if os.name == "posix":  # Windows keeps only a read-only bit
        assert stat.S_IMODE((out / "a.json").stat().st_mode) == 0o644
        assert stat.S_IMODE((out / "b.bin").stat().st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.bin"]  # no temporary left


def test_text_is_utf8(tmp_path):
    write_atomic(tmp_path / "t.txt", "世界 ✓")
    assert (tmp_path / "t.txt").read_bytes() == "世界 ✓".encode()


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_link_at_the_name_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "results.json").symlink_to(victim)
    write_atomic(tmp_path / "results.json", "new")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "results.json").is_symlink() and (tmp_path / "results.json").read_text() == "new"


def test_a_failure_midway_leaves_the_old_file(out):
    target = out / "grades.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as f:
            f.write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [p.name for p in out.iterdir()] == ["grades.csv"]


def test_a_directory_planted_while_writing_keeps_the_file_and_says_where(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(OutputBlocked) as blocked:
        with atomic_file(target) as f:
            f.write("kept")
            target.mkdir()
    message = str(blocked.value)
    assert message.startswith(f"{target} is a directory, not a file")
    kept = message.rsplit("kept in ", 1)[1]
    assert open(kept).read() == "kept"


def test_check_target_refuses_what_could_not_be_replaced(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputBlocked, match="is a directory, not a file"):
        check_target(tmp_path / "d")
    with pytest.raises(OutputBlocked, match="no directory .* to write it in"):
        check_target(tmp_path / "missing" / "out.json")
    check_target(tmp_path / "new.json")  # a new file in a directory that exists: fine
