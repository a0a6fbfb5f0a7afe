"""OpenAI's released TensorFlow runs -> our saved model directories: GPT-2's variable names and hparams mapped.

A run of the original (train_policy.py / train_reward.py, `--save_dir`) is laid out as

    RUN/train_policy_hparams.json              the task and PPO hparams (nested JSON)
    RUN/policy/hparams.json                    GPT-2 hparams (n_vocab, n_ctx, n_embd, n_head, n_layer)
    RUN/policy/encoding                        "main": the GPT-2 BPE
    RUN/policy/checkpoints/checkpoint          text; names the latest checkpoint, e.g. model.ckpt-1953
    RUN/policy/checkpoints/model.ckpt-N.index  + model.ckpt-N.data-00000-of-00001
    RUN/reward_model/...                       the same, saved by train_reward.py

OpenAI released RUN = `runs/descriptiveness` (README of openai/lm-human-preferences), named `oai:NAME` on the command
line. The checkpoint is read without TensorFlow and converted once into CACHE_DIR/oai-converted/..., in the format
`save_model_dir` writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lm_human_preference_details.language.model import Policy, RewardModel, save_model_dir
from lm_human_preference_details.language.tf_checkpoint import TFCheckpoint, latest_checkpoint
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.utils.downloads import OAI_URL
from lm_human_preference_details.utils.errors import UserError

OAI_RUNS_URL = f"{OAI_URL}/runs"


SCOPES = {"policy": "policy", "reward": "reward_model"}  # the original's variable scopes (train_policy.py, rewards.py)


# ----------------------------------------------------------------------------- names and conversion
def hf_gpt2_name(name: str) -> str | None:
    """An OAI GPT-2 variable name below SCOPE/model/ -> the Hugging Face GPT2LMHeadModel parameter, or None."""
    # OAI lm_human_preferences/language/model.py: Model.__call__ (wte, wpe, h%d/..., ln_f), norm (g, b), conv1x1 (w, b)
    if name in ("wte", "wpe"):
        return f"transformer.{name}.weight"
    match = re.fullmatch(r"(?:(h\d+)/)?(ln_1|ln_2|ln_f|attn/c_attn|attn/c_proj|mlp/c_fc|mlp/c_proj)/(g|b|w)", name)
    if not match or (match.group(1) is None) != (match.group(2) == "ln_f"):
        return None
    block, module, param = match.groups()
    prefix = "transformer." + (f"h.{block[1:]}." if block else "")
    return prefix + module.replace("/", ".") + "." + {"g": "weight", "b": "bias", "w": "weight"}[param]


def gpt2_config(hparams: dict):
    """OAI model hparams (language/model.py: HParams) -> a GPT2Config with dropout off (FIDELITY B4 no dropout)."""
    from transformers import GPT2Config  # transformers takes seconds to import: a flag's error line never waits for it

    missing = [k for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer") if k not in hparams]
    if missing:
        raise UserError(f"OAI model hparams lack {', '.join(missing)}")
    eot = 50256  # language/encodings.py: Main's eot_token; a tiny test vocabulary has none
    # the original: tanh GELU (gelu_new), layer norm epsilon 1e-5, scaled attention: GPT2Config's defaults
    return GPT2Config(vocab_size=hparams["n_vocab"], n_positions=hparams["n_ctx"], n_embd=hparams["n_embd"],
                      n_head=hparams["n_head"], n_layer=hparams["n_layer"], resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      **({} if hparams["n_vocab"] > eot else {"bos_token_id": None, "eos_token_id": None}))


def convert_model_dir(model_dir: str | Path, kind: str, out: str | Path, task: dict | None = None,
                      prefix: str | Path | None = None, replace: bool = True) -> Path:
    """An OAI RUN/policy or RUN/reward_model directory -> our saved model directory ``out`` (FIDELITY B3 head init, D8 saved
    gain and bias); ``replace=False``: a cache entry, kept if another process published it first.

    The checkpoint is ``prefix``, by default the latest one of the directory.
    """
    from transformers import GPT2LMHeadModel  # transformers takes seconds to import: a flag's error line never waits for it

    model_dir = Path(model_dir)
    try:
        hparams = json.loads((model_dir / "hparams.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{model_dir} has no readable hparams.json of an OpenAI run ({e})") from None
    encoding = model_dir / "encoding"
    if encoding.is_file() and json.loads(encoding.read_text()) != "main":
        raise UserError(f"{model_dir} uses the encoding {encoding.read_text().strip()}; only 'main' (GPT-2) is supported")
    ckpt = TFCheckpoint(prefix or latest_checkpoint(model_dir))
    scope = SCOPES[kind]
    values = {name[len(scope) + 1 :]: name for name in ckpt.entries if name.startswith(scope + "/")}
    if not any(n.startswith("model/") for n in values):
        found = sorted({n.split("/")[0] for n in ckpt.entries})
        raise UserError(f"checkpoint {ckpt.prefix} has no {scope}/model/ variables (scopes: {', '.join(found)}); "
                        f"is it a {kind} model?")

    def tensor(name: str) -> torch.Tensor:
        if name not in values:
            raise UserError(f"checkpoint {ckpt.prefix} lacks {scope}/{name}")
        return torch.from_numpy(ckpt.read(values[name]))

    lm = GPT2LMHeadModel(gpt2_config(hparams))
    state = {}
    for name in values:
        hf = hf_gpt2_name(name[len("model/") :]) if name.startswith("model/") else None
        if hf is not None:  # optimizer slots (.../adam, .../adam_1) and heads map to None
            value = tensor(name)
            state[hf] = value[0] if name.endswith("/w") and value.dim() == 3 else value  # conv1x1: [1, nx, nf] -> [nx, nf]
    missing, unexpected = lm.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]  # tied; a causal buffer
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt.prefix} does not match its hparams: missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]}")
    lm.tie_weights()
    tokenizer = gpt2_tokenizer()
    model = RewardModel(lm, tokenizer.pad_token_id) if kind == "reward" else Policy(lm, tokenizer.pad_token_id, 1.0)
    head = "reward" if kind == "reward" else "value"
    with torch.no_grad():
        # OAI lm_human_preferences/language/model.py: fc_layer(h, ()) -> w [n_embd], b []
        model.head.weight.copy_(tensor(f"model/heads/{head}/w").reshape(1, -1))
        model.head.bias.copy_(tensor(f"model/heads/{head}/b").reshape(1))
        if kind == "reward":  # OAI lm_human_preferences/rewards.py: reward_norm/gain, reward_norm/bias
            model.gain.copy_(tensor("reward_norm/gain").reshape(()))
            model.bias.copy_(tensor("reward_norm/bias").reshape(()))
    saved = {"converted_from": str(ckpt.prefix), "oai_model_hparams": hparams}
    if task is not None:
        saved["task"] = task
    save_model_dir(out, model, tokenizer, saved, replace=replace)
    return Path(out)
