"""online/schedule.py: the paper's l(n) at hand-computed points, when requests go out and trainings happen, the flags."""

from __future__ import annotations

import pytest
from helpers.online import online_args

from lm_human_preference_details.online.schedule import Schedule
from lm_human_preference_details.utils.errors import UserError


def test_labels_wanted_is_the_papers_formula_at_hand_computed_points():
    s = Schedule(initial_labels=100, final_labels=500, total_episodes=1000, margin=1000, retrainings=3)
    # l(n) = 100 + 400 * (1 - (1 - n / 1000)^2)
    assert s.labels_wanted(0) == 100
    assert s.labels_wanted(250) == pytest.approx(100 + 400 * (1 - 0.75**2))  # 275
    assert s.labels_wanted(500) == pytest.approx(400)
    assert s.labels_wanted(1000) == 500


def test_requests_go_out_while_fewer_than_l_n_plus_the_margin():
    s = Schedule(initial_labels=100, final_labels=500, total_episodes=1000, margin=1000, retrainings=3)
    assert s.should_request(1099, 0) and not s.should_request(1100, 0)
    assert s.should_request(1399, 500) and not s.should_request(1400, 500)
    assert not Schedule(100, 500, 1000, margin=0, retrainings=3).should_request(100, 0)


def test_trainings_happen_at_evenly_spaced_values_of_l_n():
    s = Schedule(initial_labels=100, final_labels=500, total_episodes=1000, margin=0, retrainings=3)
    assert s.training_points() == [100, 200, 300, 400]
    # l(n) = 200 where (1 - n / 1000)^2 = 0.75: n = 1000 * (1 - sqrt(0.75)) = 133.97
    assert s.trainings_due(0) == 1 and s.trainings_due(133) == 1 and s.trainings_due(134) == 2
    assert s.trainings_due(999) == 4  # the last a step short of N_r: l(n) reaches 500 only after the last episode
    assert [s.training_labels(k, batch_size=32) for k in range(4)] == [96, 192, 288, 384]  # whole batches
    paper = Schedule(initial_labels=1000, final_labels=20000, total_episodes=10**6, margin=1000, retrainings=19)
    assert len(paper.training_points()) == 20 and paper.training_points()[1] == 1950
    assert Schedule(100, 100, 1000, margin=0, retrainings=19).training_points() == [100]  # the offline limit


@pytest.mark.parametrize("flags, message", [
    (["--online.num-labels", "100"], "--online.num-labels"),  # fewer than N_r^0 (1536)
    (["--online.num-labels", "2048", "--online.labeller", "human"], "invalid choice 'human' for argument '--online.labeller'"),
    (["--online.num-labels", "2048", "--online.margin", "-1"], "--online.margin"),
    (["--online.num-labels", "2048", "--rewards.trained-model", "x"], "--rewards.trained-model"),
    (["--online.num-labels", "2048", "--online.labeller", "command"], "needs --online.command"),
    (["--online.num-labels", "2048", "--online.timeout", "0"], "--online.timeout is 0"),
    (["--online.num-labels", "2048", "--online.timeout", "3e6"], "--online.timeout is 3e\\+06; pass a number of seconds"),
    (["--online.num-labels", "2048", "--online.timeout", "1e10"], "--online.timeout is 1e\\+10"),
    (["--online.num-labels", "2048", "--online.labeller", "command", "--online.command", 'judge "x'],
     "--online.command 'judge \"x' cannot be split into a program and its arguments \\(No closing quotation\\)"),
    (["--online.num-labels", "2048", "--online.labeller", "command", "--online.command", "judge \\"],
     "cannot be split into a program and its arguments \\(No escaped character\\)"),
    (["--online.num-labels", "-5"], "--online.num-labels is -5; pass the labels at the end of the run"),
    (["--online.labeller", "command", "--online.command", "judge"],
     "--online.labeller, --online.command without --online.num-labels: online collection is off, so they do nothing"),
    (["--online.margin", "5"], "--online.margin without --online.num-labels"),
    (["--online.num-labels", "2048", "--online.retrainings", str(10**10)],
     "--online.retrainings 10000000000 is more than the 512 labels that arrive after the first training"),
    (["--online.num-labels", "1576", "--online.retrainings", "1000"], "--online.retrainings 1000 is more than the 40"),
    (["--online.num-labels", "2048", "--online.labeller", "page", "--online.host", ""], "--online.host is empty"),
])
def test_bad_online_flags_are_one_line_each(flags, message):
    with pytest.raises(UserError, match=message):
        online_args(*flags)
    assert not online_args().online.enabled  # off by default


def test_the_command_labellers_name_defaults_to_its_program_and_is_checked():
    from lm_human_preference_details.online.schedule import OnlineHParams

    assert OnlineHParams(labeller="command", command="python judge.py --fast").command_name() == "judge.py"
    assert OnlineHParams(labeller="command", command="./bin/my_judge -v").command_name() == "my_judge"
    named = OnlineHParams(num_labels=8, retrainings=1, labeller="command", command="python judge.py",
                          labeller_name="judge v2")
    assert named.command_name() == "judge v2"
    named.check(4, None)
    with pytest.raises(UserError, match=r"--online.labeller-name 'a\\x07b' is not a name of 1..64 printable"):
        OnlineHParams(num_labels=8, retrainings=1, labeller="command", command="j", labeller_name="a\x07b").check(4, None)
    with pytest.raises(UserError, match="--online.labeller-name names the command labeller"):
        OnlineHParams(num_labels=8, retrainings=1, labeller="page", labeller_name="ann").check(4, None)
