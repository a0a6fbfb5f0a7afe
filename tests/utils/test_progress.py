"""progress.py: bars redrawn in place on a terminal, whole lines every ~5% in a log file, prints that keep them intact."""

import io

from lm_human_preference_details.utils.progress import progress, write_above_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_file_a_bar_is_whole_lines_and_prints_get_their_own():
    log = io.StringIO()  # not a terminal
    for i in progress(range(200), desc="labels", file=log):
        if i == 101:
            write_above_progress("sample: a happy query", file=log)
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert "sample: a happy query" in lines
    bars = [line for line in lines if line != "sample: a happy query"]
    assert all(line.startswith("labels:") for line in bars)
    assert 10 <= len(bars) <= 22  # one line per 5% (10 items), the first and the last
    assert "200/200" in bars[-1] and "0/200" in bars[0]
    assert sum("200/200" in line for line in bars) == 1  # the final count once


def test_on_a_terminal_the_bar_is_redrawn_in_place():
    screen = Terminal()
    bar = progress(total=50, desc="pretraining", file=screen, mininterval=0)
    for _ in range(50):
        bar.update()
    bar.close()
    assert screen.getvalue().count("\r") >= 10 and screen.getvalue().count("\n") <= 1


def test_unknown_total_in_a_log_file_is_not_redrawn_every_step():
    log = io.StringIO()
    bar = progress(desc="downloading", file=log)
    for _ in range(1000):
        bar.update()
    bar.close()
    lines = log.getvalue().splitlines()
    assert 1 <= len(lines) <= 3 and "1000" in lines[-1]


def test_the_final_count_is_one_line_whatever_width_the_rate_leaves_the_bar():
    """tqdm redraws the final count on close; a rate of another length there changes the bar's width, not the count."""
    from lm_human_preference_details.utils.progress import _Lines

    log = io.StringIO()
    lines = _Lines(log)
    lines.write("\rlabels: 100%|██████████| 200/200 [00:00<00:00, 1234.56it/s]")
    lines.write("\rlabels: 100%|███████████| 200/200 [00:00<00:00, 999.12it/s]")
    lines.write("\rlabels: 100%|███████████| 201/201 [00:00<00:00, 999.12it/s]")
    assert log.getvalue().splitlines() == ["labels: 100%|██████████| 200/200 [00:00<00:00, 1234.56it/s]",
                                           "labels: 100%|███████████| 201/201 [00:00<00:00, 999.12it/s]"]
