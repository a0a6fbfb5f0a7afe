"""cli/main.py: both scripts' main(): the help, and leaving torchrun's process group only when no peer may still wait."""

from __future__ import annotations

import pytest


def test_help_is_tyros(capsys):
    import train_policy

    with pytest.raises(SystemExit) as e:
        train_policy.main(["--help"])
    out = capsys.readouterr()
    assert e.value.code == 0 and out.out.startswith("usage: ") and "--ppo.lr FLOAT" in out.out and not out.err
    title = train_policy.__doc__.split("\n")[0]  # the help's title: the docstring's first line (entry.run_script)
    assert " ".join(title.split()) in " ".join(out.out.split())


@pytest.mark.parametrize("ending, leaves", [(None, True), ("JobFailed", True), ("Stopped", True), ("UserError", False),
                                            ("RuntimeError", False)])
def test_the_process_group_is_left_only_when_no_peer_may_still_wait(monkeypatch, ending, leaves):
    """After a run that succeeded, or a failure or stop every process agreed on, the process leaves torchrun's group;
    after any other failure a peer may still wait in a collective, so it does not (docs/ranks.md)."""
    import signal

    import train_reward
    from lm_human_preference_details.cli import main
    from lm_human_preference_details.utils import errors

    raised = {"JobFailed": errors.JobFailed("error: x", 2), "Stopped": errors.Stopped("stopped", signal.SIGTERM),
              "UserError": errors.UserError("x"), "RuntimeError": RuntimeError("a bug")}
    left = []
    monkeypatch.setattr(main, "shutdown_distributed", lambda: left.append(True))

    def train(args):
        if ending:
            raise raised[ending]
        return "trained"

    if ending is None:
        assert main.run_script(train_reward.build_args, train, "title", ["--task", "offline"]) == "trained"
    else:
        with pytest.raises(type(raised[ending])):
            main.run_script(train_reward.build_args, train, "title", ["--task", "offline"])
    assert left == ([True] if leaves else [])
