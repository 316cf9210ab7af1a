"""courseroot.py: the nearest ancestor that is a course (theinference.toml, or the adapters of either edition)."""

import os

import pytest

from theinference.courseroot import ADAPTERS_CANDIDATES, CONFIG_NAME, find_root


def test_the_nearest_marked_ancestor(tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "inner"
    (inner / "src" / "deep").mkdir(parents=True)
    (outer / CONFIG_NAME).write_text("")
    assert find_root(str(inner / "src" / "deep")) == str(outer.resolve())
    (inner / "tests").mkdir()
    (inner / "tests" / "adapters.py").write_text("")
    assert find_root(str(inner / "src" / "deep")) == str(inner.resolve())


@pytest.mark.parametrize("adapters", ADAPTERS_CANDIDATES)
def test_either_editions_adapters_mark_a_course(tmp_path, adapters):
    (tmp_path / adapters).parent.mkdir(parents=True)
    (tmp_path / adapters).write_text("")
    assert find_root(str(tmp_path)) == str(tmp_path.resolve())


def test_a_directory_named_like_the_config_is_no_mark(tmp_path):
    (tmp_path / CONFIG_NAME).mkdir()
    (tmp_path / "tests" / "adapters.py").mkdir(parents=True)
    assert find_root(str(tmp_path)) == find_root(str(tmp_path.parent))  # not this one: whatever is above


def test_an_unmarked_directory_is_not_a_course(tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    assert find_root(str(lone)) == find_root(str(tmp_path.parent))


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_links_are_resolved(tmp_path):
    course = tmp_path / "course"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.py").write_text("")
    (tmp_path / "link").symlink_to(course)
    assert find_root(str(tmp_path / "link")) == str(course.resolve())
