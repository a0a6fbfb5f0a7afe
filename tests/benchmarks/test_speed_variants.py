"""benchmarks/speed_variants.py end to end on a CPU at a tiny size: the table, the floors, the profile it prints on a GPU."""

import subprocess

import pytest
from helpers.errors import assert_one_error_line

from benchmarks import speed_variants
from lm_human_preference_details.language import gpt2, lm_head, step_graph


def test_switches_are_set_for_the_duration_and_put_back():
    before = (lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS, step_graph.ENABLED, gpt2.DECODE_ATTENTION)
    assert before == (64, 2**30, True, "auto")  # the package's defaults are the 'after' variant
    with speed_variants.switches(multiple=1, keep=2**27, graph=False, attention="products"):
        assert (lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS, step_graph.ENABLED,
                gpt2.DECODE_ATTENTION) == (1, 2**27, False, "products")
    assert (lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS, step_graph.ENABLED,
            gpt2.DECODE_ATTENTION) == before
    assert speed_variants.VARIANTS[-1][:2] == ("after (the defaults)", dict(multiple=64, keep=2**30, graph=True,
                                                                           attention="auto"))


def test_the_gpu_report_runs_on_a_cpu_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "variants.md"
    assert speed_variants.main(["--device", "cpu", "--sizes", "tiny", "--batch-size", "8", "--repeats", "1",
                                "--variants", "before", "--large", "none", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert [line for line in out.read_text().splitlines() if line] == [line for line in text.splitlines() if line]
    rows = [line for line in text.splitlines() if line.startswith("| before") or line.startswith("| after")]
    assert [r.split(" | ")[0] for r in rows] == ["| before", "| after (the defaults)"]
    # on a CPU no switch applies: the defaults update to exactly the numbers of 'before'
    assert rows[1].endswith("| 0.0e+00, 0.0e+00, 0 |")
    assert "head product, 50304 rows, TFLOP/s" in text and "copy, TB/s" in text
    assert "sampled tokens per second (8 x 24 in" in text and "TFLOP of matrix products" in text
    assert "CPU operator (self) time of one update of 'after (the defaults)'" in text and "| `aten::" in text
    assert "CPU operator (self) time of one sampling pass of 'after (the defaults)'" in text


def test_out_is_a_new_file_or_a_report_of_ours_and_nothing_else_is_touched(tmp_path, capsys):
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    for out, why in ((mine, "exists and no run of speed_variants.py wrote it"), (tmp_path, "names a directory")):
        with pytest.raises(SystemExit) as e:
            speed_variants.main(["--device", "cpu", "--sizes", "--large", "none", "--out", str(out)])
        line = assert_one_error_line(subprocess.CompletedProcess([], e.value.code, "", capsys.readouterr().err), why)
        assert line.startswith("error: --out ")
    assert mine.read_text() == "my notes\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]
    ours = tmp_path / "report.md"
    ours.write_text("# speed_variants.py on CPU, an earlier run\n")
    assert speed_variants.main(["--device", "cpu", "--sizes", "--large", "none", "--out", str(ours)]) == 0
    assert ours.read_text().startswith("# speed_variants.py on CPU, torch ") and "Measured here" in ours.read_text()
