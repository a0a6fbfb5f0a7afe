"""A policy named by a flag (a policy saved by train_policy.py, oai:NAME, an OAI TF policy directory or a Hugging Face
causal LM): checked before anything loads (`check_policy_path`), then loaded (`load_policy`). sample.py and label.py
both sample policies through it."""

from __future__ import annotations

from pathlib import Path

from lm_human_preference_details.language.model import Policy, load_lm, load_model_dir
from lm_human_preference_details.language.model_files import (
    base_model_config,
    check_lm_config,
    check_model_files,
    is_local_model,
)
from lm_human_preference_details.language.oai_checkpoints import is_tf_checkpoint, resolve_policy
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.tasks import TaskHParams, positions_needed
from lm_human_preference_details.utils.errors import UserError


def check_policy_path(flag: str, source: str, default_of: str | None, task: TaskHParams) -> None:
    """A policy path that exists, and not a run directory or its training checkpoints (which hold no model one can
    sample): each one line naming the policy to pass; then a model that can be a policy for ``task``
    (model_files.check_lm_config). ``default_of``: the task whose default path ``source`` is."""
    path = Path(source).expanduser()
    if source.startswith("oai:") or is_tf_checkpoint(path):
        return  # OpenAI's runs: converted (and checked) as they load
    if not is_local_model(source):  # a hub model: cached, or the hub reachable
        return check_lm_config(base_model_config(source, flag), f"{flag} {source}", *positions_needed(task))
    if not path.exists():
        how = (f" (the default of --task {default_of}): train one with `python train_policy.py --task {default_of}` or "
               if default_of else "; ")
        raise UserError(f"{flag} {source} does not exist{how}pass {flag} RUN/policy (saved by train_policy.py), "
                        "oai:NAME or a Hugging Face model name")
    checkpoint, checkpoints = (path / "state.pt").is_file(), path.name == "checkpoints" and path.is_dir()
    run = path.parent.parent if checkpoint else path.parent if checkpoints else path
    what = (f"a training checkpoint of the run {run}" if checkpoint else f"the training checkpoints of the run {run}"
            if checkpoints else "a run directory")
    if (run / "policy").is_dir():
        raise UserError(f"{flag} {source} is {what}, not a saved policy; pass {flag} {run / 'policy'}")
    if (run / "reward_model").is_dir():
        raise UserError(f"{flag} {source} is a reward model run (train_reward.py), not a policy; pass {flag} RUN/policy of "
                        f"a train_policy.py run (--reward-model {run / 'reward_model'} scores samples)")
    if checkpoint or checkpoints:
        raise UserError(f"{flag} {source} is {what}, which has saved no policy yet (train_policy.py writes "
                        f"{run / 'policy'} at its first save); pass {flag} RUN/policy of a saved run")
    config = check_model_files(path, flag, f"pass {flag} RUN/policy as train_policy.py saved it")
    check_lm_config(config, f"{flag} {source}", *positions_needed(task))


def load_policy(path: str, tokenizer, temperature: float, device) -> tuple[Policy, str]:
    """A saved policy directory, oai:NAME, an OAI TF policy directory or a Hugging Face LM -> (policy, base model)."""
    local = resolve_policy(path)
    if (Path(local) / "head.pt").is_file():  # one of our saved directories (or a converted OAI policy)
        policy, policy_tokenizer, hparams = load_model_dir(local, "policy", device, temperature=temperature)
        base = hparams.get("base_model") or ("gpt2" if "converted_from" in hparams else local)  # OAI: GPT-2 124M
    else:  # a plain causal LM: the initial policy of a run (value head 0, FIDELITY B3 head init)
        policy_tokenizer = load_tokenizer(local)
        policy, base = Policy(load_lm(local), policy_tokenizer.pad_token_id, temperature).to(device), local
    if policy_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"policy {path} uses another tokenizer than the first policy; compare policies of one base model")
    return policy.requires_grad_(False), base
