"""The names of the failure shapes a diagnosis can give: the keys a stage file's [hints] may use.

theinference.grading.judge.diagnose names the first eight from the rows (its docstring says what each means);
theinference.grading.judge.scaling names the last four from the cost of cache-scaling's calls.
"""

SHAPES = (
    "nonfinite-row",
    "shifted-by-one",
    "all-rows-off",
    "error-grows",
    "first-ok-then-flat",
    "first-decode-row-off",
    "token-mismatch",
    "no-pattern",
    "no-cache",
    "too-slow",
    "machine-busy",
    "cost-tampered",
)

# The shapes each kind of stage (grading/spec/checks.py's `kind`) can fail with: a [hints] key outside its
# kind's would never be shown, so the loader refuses it.
SHAPES_OF_KIND = {
    "rows": (
        "nonfinite-row",
        "shifted-by-one",
        "all-rows-off",
        "error-grows",
        "first-ok-then-flat",
        "first-decode-row-off",
        "no-pattern",
    ),
    "tokens": ("token-mismatch",),
    "scaling": ("token-mismatch", "no-cache", "too-slow", "machine-busy", "cost-tampered"),
}
