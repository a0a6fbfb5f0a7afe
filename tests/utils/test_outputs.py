"""The one gate of every output (utils/outputs.py), called directly: what each kind of path gets, before anything is
written; the commands' own tests run it through their command lines (tests/test_export.py, tests/run/...)."""

import pytest

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.outputs import (
    OUTPUT_MARKER,
    check_output_dir,
    check_output_file,
    first_line_starts,
    new_or_ours,
    write_output_dir,
)


def test_a_directory_is_new_empty_or_ours_of_the_same_kind_and_only_with_overwrite(tmp_path):
    assert check_output_dir(tmp_path / "new", "labels", flag="OUT", overwrite=False).mode == "fresh"
    (tmp_path / "empty").mkdir()
    assert check_output_dir(tmp_path / "empty", "labels", flag="OUT", overwrite=False).mode == "fresh"
    with write_output_dir(check_output_dir(tmp_path / "ours", "labels", flag="OUT", overwrite=False)) as tmp:
        (tmp / "a.parquet").write_text("a")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == [OUTPUT_MARKER, "a.parquet"]
    for kind, overwrite, message in (("labels", False, "already holds a labels export; pass --overwrite"),
                                     ("verl", True, "holds a labels export, and this is a verl export")):
        with pytest.raises(UserError, match=message):
            check_output_dir(tmp_path / "ours", kind, flag="OUT", overwrite=overwrite, noun="export")
    assert check_output_dir(tmp_path / "ours", "labels", flag="OUT", overwrite=True).mode == "overwrite"
    (tmp_path / "yours").mkdir()
    (tmp_path / "yours" / "notes.md").write_text("mine")
    with pytest.raises(UserError, match="holds files that are not an export of this project"):
        check_output_dir(tmp_path / "yours", "labels", flag="OUT", overwrite=True, noun="export")
    with pytest.raises(UserError, match="lies inside, the input"):
        check_output_dir(tmp_path / "yours" / "out", "labels", flag="OUT", overwrite=False,
                         inputs=[tmp_path / "yours"], noun="export")
    assert (tmp_path / "yours" / "notes.md").read_text() == "mine" and not (tmp_path / "yours" / "out").exists()


def test_a_file_is_new_or_one_the_project_wrote(tmp_path):
    mine = tmp_path / "mine.md"
    mine.write_text("mine")
    assert check_output_file(tmp_path / "new.md", flag="--out") == tmp_path / "new.md"
    with pytest.raises(UserError, match="exists and no command of this project wrote it"):
        check_output_file(mine, flag="--out")
    with pytest.raises(UserError, match="names a directory"):
        check_output_file(tmp_path, flag="--out")
    assert check_output_file(mine, flag="--out", ours=lambda p: p.read_text() == "mine") == mine
    with pytest.raises(FileExistsError):  # put in place only over a file of ours
        with new_or_ours(mine, lambda p: False) as tmp:
            tmp.write_text("new")
    assert mine.read_text() == "mine"
    with new_or_ours(mine, lambda p: True) as tmp:
        tmp.write_text("new")
    assert mine.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.md"]


def test_a_report_is_ours_by_its_first_line(tmp_path):
    ours = first_line_starts(b"# report of ours")
    (tmp_path / "a.md").write_text("# report of ours, 2026\nrows\n")
    (tmp_path / "b.md").write_text("notes\n# report of ours\n")
    assert ours(tmp_path / "a.md") and not ours(tmp_path / "b.md")
