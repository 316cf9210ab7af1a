"""Reading the student's deepest frame in the course from a traceback their process sent (hostile text)."""

from theinference.grading.judge.frames import deepest_course_frame


def frame(path, line: int) -> str:
    return f'  File "{path}", line {line}, in f\n    x = 1\n'


def test_the_deepest_frame_inside_the_course_wins(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "kvcache.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "adapters.py").write_text("x = 1\n")
    text = (
        "Traceback (most recent call last):\n"
        + frame(tmp_path / "tests" / "adapters.py", 3)
        + frame(tmp_path / "src" / "kvcache.py", 48)
        + frame("/usr/lib/python3/site-packages/numpy/core.py", 9)
        + "ValueError: boom\n"
    )
    assert deepest_course_frame(text, tmp_path) == ("src/kvcache.py", 48)


def test_names_outside_the_course_relative_or_absurd_are_ignored(tmp_path):
    course = tmp_path / "course"
    (course / "src").mkdir(parents=True)
    (course / "src" / "ok.py").write_text("x = 1\n")
    (tmp_path / "secret.py").write_text("x = 1\n")
    (course / "src" / "link.py").symlink_to(tmp_path / "secret.py")  # inside by name, outside once resolved
    forged = [
        frame(course / "src" / "link.py", 2),
        frame("src/ok.py", 2),
        frame(f"{course}/../secret.py", 2),
        frame(f"{course}/src/ok.py\0", 2),
        frame(course / "src", 2),
        frame(course / "src" / "ok.py", 0),
    ]
    for text in forged:
        assert deepest_course_frame(text, course) is None, text
    assert deepest_course_frame(frame(course / "src" / "ok.py", 1) + "".join(forged), course) == ("src/ok.py", 1)
