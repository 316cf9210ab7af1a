"""headline.py: the report's first line, "theinference VERSION grading COURSE", plain or in ANSI colour."""

from theinference.headline import headline_ansi, headline_parts


def test_plain_headline():
    assert headline_ansi("0.1.0", "/home/s/course", color=False) == "theinference 0.1.0 grading /home/s/course"


def test_coloured_headline_styles_the_name_and_the_course():
    assert headline_ansi("0.1.0", "/c", color=True) == "\x1b[1mtheinference 0.1.0\x1b[0m grading \x1b[36m/c\x1b[0m"


def test_a_course_path_cannot_drive_the_terminal():
    text = headline_ansi("0.1.0", "/tmp/\x1b[2Jx", color=True)
    assert "\x1b[2J" not in text and "/tmp/\\x1b[2Jx" in text
    assert headline_parts("0", "/tmp/\x1b]0;title\x07")[2] == ("/tmp/\\x1b]0;title\\x07", "cyan")
