"""Models named by a flag: a policy saved by train_policy.py, oai:NAME (OpenAI's released runs), an OpenAI TF run's
directory or a Hugging Face causal LM; checked before anything loads (`check_policy_path`), then resolved to a model
directory of ours (`resolve_policy`, `resolve_reward_model`) and loaded (`load_policy`)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from lm_human_preference_details.language.cards import saved_path
from lm_human_preference_details.language.model import Policy, head_file, load_lm, load_model_dir
from lm_human_preference_details.language.model_files import (
    base_model_config,
    check_lm_config,
    check_model_files,
    is_local_model,
)
from lm_human_preference_details.language.oai_checkpoints import OAI_RUNS_URL, SCOPES, convert_model_dir
from lm_human_preference_details.language.tf_checkpoint import TFCheckpoint, is_tf_checkpoint, latest_checkpoint
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.downloads import DownloadError, fetch
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import cache_lock


def check_policy_path(flag: str, source: str, default_of: str | None, positions: tuple[int, str]) -> None:
    """A policy path that exists, and not a run directory or its training checkpoints (which hold no model one can
    sample): each one line naming the policy to pass; then a model with room for ``positions`` (the task's
    `positions_needed`: the count and the flags that make it up). ``default_of``: the task whose default path it is."""
    path = Path(source).expanduser()
    if source.startswith("oai:") or is_tf_checkpoint(path):
        return  # OpenAI's runs: converted (and checked) as they load
    if not is_local_model(source):  # a hub model: cached, or the hub reachable
        return check_lm_config(base_model_config(source, flag), f"{flag} {source}", *positions)
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
    check_lm_config(config, f"{flag} {source}", *positions)


def load_policy(path: str, tokenizer, temperature: float, device) -> tuple[Policy, str]:
    """A saved policy directory, oai:NAME, an OAI TF policy directory or a Hugging Face LM -> (policy, base model)."""
    local = resolve_policy(path)
    if head_file(local):  # one of our saved directories (or a converted OAI policy)
        policy, policy_tokenizer, hparams = load_model_dir(local, "policy", device, temperature=temperature)
        base = hparams.get("base_model") or ("gpt2" if "converted_from" in hparams else local)  # OAI: GPT-2 124M
        base = saved_path(base, local)  # written relative to the directory, or under ~ (cards.portable_paths)
    else:  # a plain causal LM: the initial policy of a run (value head 0, FIDELITY B3 head init)
        policy_tokenizer = load_tokenizer(local)
        policy, base = Policy(load_lm(local), policy_tokenizer.pad_token_id, temperature).to(device), local
    if policy_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"policy {path} uses another tokenizer than the first policy; compare policies of one base model")
    return policy.requires_grad_(False), base


# ----------------------------------------------------------------------------- oai:NAME and OpenAI's local runs
# ----------------------------------------------------------------------------- resolving oai:NAME and local runs
def _run_task(run_dir: Path) -> dict | None:
    """The task hparams saved at the top of an OAI run directory, if there."""
    for name in ("train_policy_hparams.json", "train_reward_hparams.json"):
        path = run_dir / name
        if path.is_file():
            task = json.loads(path.read_text()).get("task")
            if isinstance(task, dict):
                return task
    return None


def download_oai_model(name: str, kind: str, cache_dir: str | Path | None = None) -> Path:
    """Download OAI_RUNS_URL/NAME/{policy,reward_model} (once, cached) -> the local model directory."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", name) or ".." in name.split("/"):
        raise UserError(f"oai:{name} is not a run name like oai:descriptiveness")
    base = f"{OAI_RUNS_URL}/{name}"
    url = f"{base}/{SCOPES[kind]}/hparams.json"
    try:
        local = fetch(url, cache_dir=cache_dir).parent
        for optional in ("train_policy_hparams.json", "train_reward_hparams.json", f"{SCOPES[kind]}/encoding"):
            try:  # the run's task and the encoding name, used when they are there
                fetch(f"{base}/{optional}", cache_dir=cache_dir)
            except DownloadError:
                pass
        url = f"{base}/{SCOPES[kind]}/checkpoints/checkpoint"
        fetch(url, cache_dir=cache_dir)
        prefix = latest_checkpoint(local)
        remote = f"{base}/{SCOPES[kind]}/{prefix.relative_to(local).as_posix()}"
        url = remote + ".index"
        fetch(url, cache_dir=cache_dir)
        num_shards = TFCheckpoint(prefix).num_shards
        for shard in range(num_shards):
            url = f"{remote}.data-{shard:05d}-of-{num_shards:05d}"
            fetch(url, cache_dir=cache_dir)
    except DownloadError as e:
        raise UserError(f"OpenAI's released run file {url} could not be downloaded ({e.reason}); it may no longer be "
                        f"hosted: download the run on a machine that can reach it and pass its local "
                        f"{SCOPES[kind]} directory") from None
    return local


def resolve_model(path: str | Path, kind: str, cache_dir: str | Path | None = None) -> str:
    """`oai:NAME` or a local OAI TF model directory -> our converted directory (once, cached); else ``path``."""
    path = str(path)  # train_reward.train returns a Path
    cache = Path(cache_dir or files.CACHE_DIR)
    if path.startswith("oai:"):
        model_dir = download_oai_model(path[len("oai:") :], kind, cache_dir)
        out = cache / "oai-converted" / path[len("oai:") :] / SCOPES[kind]
    else:
        try:
            prefix = latest_checkpoint(path)
        except UserError:
            return path  # not a TF checkpoint: one of our saved directories, or a Hugging Face model
        model_dir = prefix.parent.parent if prefix.parent.name == "checkpoints" else prefix.parent  # holds hparams.json
        index = prefix.with_name(prefix.name + ".index")
        stamp = f"{prefix.resolve()}:{index.stat().st_size}:{index.stat().st_mtime_ns}"
        out = cache / "oai-converted" / ("local-" + hashlib.sha256(stamp.encode()).hexdigest()[:16]) / SCOPES[kind]
    if (out / "config.json").is_file():
        return str(out)
    with cache_lock(out):  # one process converts, however many reach it; the others wait, then read it
        if not (out / "config.json").is_file():
            print(f"converting OpenAI's TensorFlow {kind} model {path} into {out} (once)")
            convert_model_dir(model_dir, kind, out, task=_run_task(model_dir.parent),
                              prefix=None if path.startswith("oai:") else prefix, replace=out.exists())
    return str(out)


def resolve_reward_model(path: str, cache_dir: str | Path | None = None) -> str:
    """--rewards.trained-model: `oai:NAME` or an OAI TF reward_model directory -> a directory load_model_dir reads."""
    return resolve_model(path, "reward", cache_dir)


def resolve_policy(path: str, cache_dir: str | Path | None = None) -> str:
    """`oai:NAME` or an OAI TF policy directory -> a directory load_model_dir reads; anything else unchanged."""
    return resolve_model(path, "policy", cache_dir)
