"""What the evaluation tests share: a policy that the offline task's gold scorer prefers, and the evaluation command
on the tests' offline cache in a process of its own."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from helpers.labelling import START_WAIT_S, label_env
from helpers.processes import ForkedProcess, differing
from lm_human_preference_details.language.model import Policy, load_lm, save_model_dir
from lm_human_preference_details.language.tokenizer import load_tokenizer


def happy_policy(assets: Path, out: Path) -> Path:
    """Save at ``out`` a policy of the tiny model that says ' happy' (a gold word, +0.9) most of the time -> ``out``."""
    base = str(assets / "tiny-gpt2")
    tokenizer = load_tokenizer(base)
    policy = Policy(load_lm(base), tokenizer.pad_token_id, 0.7)
    (happy_id,) = tokenizer.encode(" happy")
    with torch.no_grad():  # the final layer norm's output points at ' happy' (as test_sample.py's dotty policy at '.')
        word = policy.lm.transformer.wte.weight[happy_id]
        policy.lm.transformer.ln_f.weight.fill_(0.1)
        policy.lm.transformer.ln_f.bias.copy_(10.0 * word / word.norm() ** 2)
    save_model_dir(out, policy, tokenizer, {"base_model": base})
    return out


def evaluate_command(*flags) -> list[str]:
    return [sys.executable, "-m", "lm_human_preference_details.evaluate", *map(str, flags)]


def start_page_evaluation(cache: Path, cwd: Path, *flags) -> tuple[ForkedProcess, str, list[str]]:
    """``evaluate --labeller page FLAGS`` in a process of its own (a fork of this one, helpers.processes.ForkedProcess,
    as the label tool's `helpers.labelling.start_server`: a new interpreter would add only its imports, ~7 CPU s; the
    command line itself runs for real in tests/test_evaluate.py) -> (process, the page's URL, the lines it printed)."""
    proc = ForkedProcess(*evaluate_command("--labeller", "page", *flags)[2:], env_extra=differing(label_env(cache)),
                         cwd=cwd)
    lines = []
    for line in proc.stdout:  # ends when the process does: a failed start is reported below, not waited on
        lines.append(line.rstrip("\n"))
        if (found := re.search(r"labelling page: (http://\S+/)", line)) is not None:
            return proc, found[1], lines
    proc.wait(START_WAIT_S)
    raise AssertionError("the evaluation's page did not start:\n" + "\n".join(lines))
