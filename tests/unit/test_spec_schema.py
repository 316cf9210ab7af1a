"""The stage file's schema is written once (StageSpec's and the check types' field metadata): the loader's keys and
the authoring guide's table of fields both come from it, and the guide fails this test when it disagrees."""

import dataclasses
import re
from pathlib import Path

import pytest


from theinference.grading.spec.checks import CHECK_KEYS, RowsCheck, ScalingCheck, TokensCheck
from theinference.grading.spec.schema import REQUIRED_KEYS, STAGE_KEYS, StageSpec, schema_text
from theinference.grading.spec.stages import StageError, load_stage
from test_stages import VALID  # the one valid stage file the stage tests edit

GUIDE = Path(__file__).parents[2] / "docs" / "authoring.md"


def test_the_guides_table_of_fields_is_the_schema():
    assert schema_text() in GUIDE.read_text(encoding="utf-8"), "docs/authoring.md: paste stages.schema_text()"


def test_every_field_of_a_stage_but_its_source_is_read_from_the_file():
    unread = [f.name for f in dataclasses.fields(StageSpec) if not f.metadata.get("keys")]
    assert unread == ["source"]  # where the file is: not in it


def test_a_check_is_read_from_compare_and_each_kinds_table():
    assert [k.name for k in CHECK_KEYS] == ["compare", "[tolerance]", "[tie]", "[scaling]"]
    assert RowsCheck.table.toml == "tolerance" and TokensCheck.table is ScalingCheck.table
    assert ScalingCheck.params_table.toml == "scaling"


def test_the_loader_knows_exactly_the_schemas_keys(tmp_path):
    path = tmp_path / "stage.toml"
    path.write_text('colour = "blue"\n' + VALID)
    with pytest.raises(StageError) as refused:
        load_stage(path)
    known = re.search(r"known fields: (.*)\)", str(refused.value)).group(1).split(", ")
    assert sorted(known) == sorted(key.toml for key in STAGE_KEYS)


@pytest.mark.parametrize("key", [k for k in STAGE_KEYS if k.required], ids=lambda k: k.toml)
def test_each_required_key_of_the_schema_is_required(tmp_path, key):
    lines = VALID.splitlines(keepends=True)
    if key.toml == "case":
        text = VALID[: VALID.index("[[case]]")]
    else:
        text = "".join(line for line in lines if not line.startswith(f"{key.toml} ="))
    path = tmp_path / "stage.toml"
    path.write_text(text)
    with pytest.raises(StageError, match=rf"field '{key.toml}': missing required field"):
        load_stage(path)


def test_the_loaders_keys_keep_the_order_a_file_with_several_faults_is_told_in():
    # The first missing required key named is the same as before the schema was the dataclass's.
    assert list(REQUIRED_KEYS) == [
        "format_version",
        "id",
        "title",
        "order",
        "lesson",
        "adapter",
        "oracle",
        "compare",
        "timeout",
        "points",
        "case",
    ]
