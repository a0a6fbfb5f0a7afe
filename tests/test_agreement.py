"""agreement.py: the command's tables and JSON for label files of several labellers, checked against figures worked
out by hand; the offline task's gold scorer as a labeller; bad input is one line."""

from __future__ import annotations

import json

import pytest
from helpers.errors import one_error_line

from lm_human_preference_details import agreement


def record(i: int, labels: list[tuple[str, int]]) -> dict:
    """A record of ours: item i's tokens, the first label trains."""
    return {"query": [i, 50259], **{f"sample{j}": [10 * i + j] for j in range(4)}, "best": labels[0][1],
            "labeller": labels[0][0], "labels": [{"labeller": who, "best": best} for who, best in labels]}


def test_the_tables_and_json_give_the_figures_worked_out_by_hand(tmp_path, capsys):
    # ann and bob label 4 items; cat labels items 0 and 1 in an OpenAI file of its own (cat.json: named by its stem)
    ours = [record(0, [("ann", 0), ("bob", 0)]), record(1, [("ann", 1), ("bob", 2)]),
            record(2, [("ann", 3), ("bob", 3)]), record(3, [("bob", 1), ("ann", 1)])]
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    cat = [{k: v for k, v in record(i, [("cat", best)]).items() if k not in ("labeller", "labels")}
           for i, best in ((0, 0), (1, 1))]
    (tmp_path / "cat.json").write_text(json.dumps(cat))
    agreement.main([str(tmp_path / "ours.json"), str(tmp_path / "cat.json"), "--reference", "cat"])
    out = capsys.readouterr().out
    # ann & bob: 4 items, 3 agree (75.0%); ann & cat: items 0, 1, both agree; bob & cat: item 0 agrees, item 1 not
    # overall: item 0 3 pairs agree, item 1 1 of 3 (ann-cat), items 2 and 3 one each: 6 of 8 = 75.0%
    # kappa: n_ij = [3,0,0,0], [0,2,1,0], [0,0,0,2], [0,2,0,0]; P_i = 1, 1/3, 1, 1; P_bar = 10/12 = 5/6
    #   p_j = [3, 4, 1, 2] / 10; P_e = (9 + 16 + 1 + 4) / 100 = 3/10; kappa = (5/6 - 3/10) / (7/10) = 16/21 = 0.762
    assert out.splitlines() == [
        "4 items, 4 with 2 or more labels; labellers: ann, bob, cat",
        "agreement on the best of 4 (chance: 25.0%)",
        "  labellers  items  agree   share",
        "  ann & bob      4      3   75.0%",
        "  ann & cat      2      2  100.0%",
        "  bob & cat      2      1   50.0%",
        "overall: 6 of 8 pairs of labels agree, 75.0% (chance 25.0%)",
        "Fleiss' kappa (4 choices, 4 items): 0.762 (P_bar 0.833, P_e 0.300; 0 is chance, 1 full agreement)",
        "agreement with cat:",
        "  labeller  items  agree   share",
        "  ann           2      2  100.0%",
        "  bob           2      1   50.0%",
    ]
    result = agreement.main([str(tmp_path / "ours.json"), "--json"])
    assert json.loads(capsys.readouterr().out) == result
    # ann & bob alone: P_i = 1, 0, 1, 1; P_bar = 3/4; p_j = [2, 3, 1, 2] / 8; P_e = 18/64; kappa = (3/4 - 9/32) / (23/32)
    assert result["kappa"]["value"] == pytest.approx(15 / 23) and result["reference"] is None
    assert result["pairs"] == [{"labellers": ["ann", "bob"], "items": 4, "agree": 3, "share": 0.75}]


def test_the_offline_gold_scorer_is_a_labeller(tmp_path, capsys, tokenizer):
    from lm_human_preference_details.offline.corpus import gold_score

    texts = [" happy happy", " sad", " good fun", " the"]
    samples = [tokenizer.encode(t) for t in texts]
    padded = [s + [50259] * (24 - len(s)) for s in samples]  # OpenAI's pads, as the files hold them: the task's shapes
    gold = max(range(4), key=lambda j: (gold_score(texts[j]), -j))
    other = (gold + 1) % 4
    item = {"query": [464] + [50259] * 31, **{f"sample{j}": padded[j] for j in range(4)}, "best": gold, "labeller": "ann",
            "labels": [{"labeller": "ann", "best": gold}, {"labeller": "bob", "best": other}]}
    (tmp_path / "labels.json").write_text(json.dumps([item]))
    result = agreement.main([str(tmp_path / "labels.json"), "--gold-task", "offline", "--json"])
    assert result["reference"] == {"name": "gold", "labellers": [{"labeller": "ann", "items": 1, "agree": 1, "share": 1.0},
                                                                 {"labeller": "bob", "items": 1, "agree": 0, "share": 0.0}]}


@pytest.mark.parametrize("argv, message", [
    ([], "no label file given"),
    (["missing.json"], "missing.json is not a file"),
    (["notes.json"], "notes.json is not a label file"),
    (["single.json"], "no item has labels from two labellers"),
    (["single.json", "--reference", "zed"], "no item has labels from two labellers"),
    (["single.json", "--gold-task", "sentiment"], "--gold-task sentiment has no gold scorer"),
    (["single.json", "--gold-task", "nosuch"], "unknown --gold-task 'nosuch'"),
    # another task's shapes: its gold scorer's pick of them would mean nothing
    (["single.json", "--gold-task", "offline"], "item 0 has a 2-token query and [1]-token samples"),
    (["--nope"], "--nope"),
])
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.json").write_text('{"a": 1}')
    (tmp_path / "single.json").write_text(json.dumps([record(0, [("ann", 1)])]))
    assert message in one_error_line(capsys, agreement.main, argv)


def test_each_person_counts_once_per_item_and_plain_files_of_one_stem_are_refused(tmp_path, capsys):
    """A hand-merged file with ann twice on an item (agreeing) counts ann once: no "ann & ann" pair; twice disagreeing,
    within a file or across files, is one line naming both; two plain files named ann.json are two people, refused."""
    from helpers.labelling import snapshot

    merged = [record(0, [("ann", 1), ("ann", 1), ("bob", 1)]), record(1, [("ann", 2), ("bob", 3)])]
    (tmp_path / "merged.json").write_text(json.dumps(merged))
    result = agreement.main([str(tmp_path / "merged.json"), "--json"])
    assert [p["labellers"] for p in result["pairs"]] == [["ann", "bob"]] and result["overall"]["pairs"] == 2
    (tmp_path / "torn.json").write_text(json.dumps([record(0, [("ann", 1), ("bob", 1), ("ann ", 3)])]))
    (tmp_path / "later.json").write_text(json.dumps([record(1, [("ann", 0)])]))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        plain = [{k: v for k, v in record(0, [("x", int(d == "b"))]).items() if k not in ("labeller", "labels")}]
        (tmp_path / d / "ann.json").write_text(json.dumps(plain))
    before = snapshot(tmp_path)
    cases = [(["torn.json"], "labeller 'ann' gave item 0 two labels that disagree (sample 1 in torn.json, record 0; "
                             "sample 3 in torn.json, record 0)"),
             (["merged.json", "later.json"], "sample 2 in merged.json, record 1; sample 0 in later.json, record 0"),
             (["a/ann.json", "b/ann.json"], "a/ann.json and b/ann.json are both plain label files named 'ann'")]
    for argv, message in cases:
        with pytest.MonkeyPatch.context() as m:
            m.chdir(tmp_path)
            assert message in one_error_line(capsys, agreement.main, argv)
    assert snapshot(tmp_path) == before
