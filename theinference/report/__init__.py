"""Renderers: each turns finished result objects into one output format and computes nothing."""

from theinference.report.github import render_annotations
from theinference.report.gradescope import render_gradescope
from theinference.report.jsonout import render_json
from theinference.report.junit import render_junit

TEXT_FORMATS = {
    "json": render_json,
    "junit": render_junit,
    "gradescope": render_gradescope,
    "github": lambda run, version: render_annotations(run),
}
