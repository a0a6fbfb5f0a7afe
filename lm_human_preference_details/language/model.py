"""The original's model semantics on any Hugging Face causal LM (FIDELITY B1-B5, C1-C3): `Policy`, `RewardModel`.

A forward pass here behaves like OAI `language/model.py: Model.__call__` with `padding_token` set:
pads may sit anywhere, they are never attended to, they do not advance positions, and the
output at a pad is the output of the last real token before it. Saved models are a Hugging Face
directory plus the scalar head (and the reward model's gain and bias) and the run's hparams.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from lm_human_preference_details.language.cards import portable_paths, write_card
from lm_human_preference_details.language.gpt2 import KVCache, decode_step, packed_hidden, supports_packing
from lm_human_preference_details.language.interop import (
    final_norm_bias,
    plain_pad_id,
    policy_sampling,
    reward_score,
    save_plain_lm,
    save_plain_tokenizer,
)
from lm_human_preference_details.language.lm_head import full_precision, response_logprobs, sample_categorical, sample_step
from lm_human_preference_details.language.model_files import check_model_files, is_local_model
from lm_human_preference_details.language.step_graph import StepGraphs, graphs_of
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.ppo import entropy_from_logits, logprobs_from_logits
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.outputs import atomic_dir


def prepare_inputs(tokens: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b, t] tokens -> (input_ids with pads as 0, bool mask, exclusive-cumsum position ids), all [b, t]."""
    # OAI lm_human_preferences/language/model.py: Model.__call__ (mask, X = where(mask, X, 0)) and positions_for
    mask = tokens != pad_id
    input_ids = torch.where(mask, tokens, torch.zeros_like(tokens))
    positions = torch.cumsum(mask.long(), dim=1) - mask.long()  # exclusive cumsum: pads do not advance
    return input_ids, mask, positions


def last_real_indices(mask: torch.Tensor) -> torch.Tensor:
    """[b, t] bool mask -> [b, t] index of the last real position at or before each position."""
    # OAI lm_human_preferences/language/model.py: Model.__call__ ("use the output from the last present token")
    t = mask.shape[1]
    positions = torch.arange(t, device=mask.device).expand_as(mask)
    present = torch.where(mask, positions, torch.full_like(mask, -1, dtype=torch.long))
    use = torch.cummax(present, dim=1).values
    if (use < 0).any():
        raise ValueError("a sequence starts with a pad token; the original asserts the first token is real")
    return use


def disable_dropout(module: nn.Module) -> nn.Module:
    """Set every dropout probability to 0 (FIDELITY B4 no dropout) and switch to eval mode."""
    # OAI lm_human_preferences: every forward pass is built with do_dropout=False
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "dropout", "attention_dropout"):
        if hasattr(module, "config") and isinstance(getattr(module.config, key, None), float):
            setattr(module.config, key, 0.0)
    return module.eval()


def load_lm(name_or_path: str, dtype: torch.dtype = torch.float32, quiet: bool = False) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(name_or_path)` with dropout off, or a one-line UserError; ``quiet``: no
    load report (a saved reward model's `score.weight` is there for other code, not unexpected)."""
    # transformers takes seconds to import: a flag's error line never waits for it
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars are the ones that matter
    verbosity = hf_logging.get_verbosity()
    try:
        if quiet:
            hf_logging.set_verbosity_error()
        lm = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except Exception as e:  # OSError, a safetensors or JSON error of a damaged file, an unknown architecture
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        if is_local_model(name_or_path):
            raise UserError(f"cannot load the model directory {name_or_path} ({reason}); save or copy it again") from None
        raise UserError(f"cannot load model '{name_or_path}' ({reason}); when offline, set HF_HUB_OFFLINE=1 to use "
                        "the Hugging Face cache or pass --base-model DIR, a local model directory") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return disable_dropout(lm)


class LMWithHead(nn.Module):
    """A causal LM plus one scalar head on its final hidden state (FIDELITY B3 head init)."""

    def __init__(self, lm: nn.Module, pad_id: int, head: str):
        super().__init__()
        self.lm = disable_dropout(lm)
        self.pad_id = pad_id
        # n_vocab: the real tokens only; the pad id sits right after them (FIDELITY B5 real tokens only)
        self.n_vocab = min(lm.config.vocab_size, pad_id)
        d_model = lm.config.hidden_size
        self.head = nn.Linear(d_model, 1)
        # OAI lm_human_preferences/language/model.py: fc_layer, scale 1/sqrt(n_in + 1), value head scale 0
        std = 0.0 if head == "value" else 1 / math.sqrt(d_model + 1)
        nn.init.normal_(self.head.weight, std=std) if std > 0 else nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.packed = supports_packing(lm)  # GPT-2: forward passes skip the pads (gpt2.py)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """[b, t] tokens (pads anywhere) -> [b, t, d] final hidden states with B1 pad mask and positions and B2 last real token
        applied."""
        input_ids, mask, positions = prepare_inputs(tokens, self.pad_id)
        h = self.lm.base_model(input_ids=input_ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
        # OAI lm_human_preferences/language/model.py: at a pad, use the output of the last real token (B2 last real token)
        use = last_real_indices(mask)
        return torch.gather(h, 1, use.unsqueeze(-1).expand_as(h))

    def hidden_at(self, tokens: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
        """[b, t] tokens (pads anywhere), [b, s] positions -> [b, s, d] final hidden states there, as `hidden` gives."""
        input_ids, mask, positions = prepare_inputs(tokens, self.pad_id)
        read = last_real_indices(mask).gather(1, read)  # B2 last real token: a pad reads the last real token before it
        if self.packed:  # the same numbers, computed on the real tokens only
            return packed_hidden(self.lm.base_model, input_ids, mask, positions, read)
        h = self.lm.base_model(input_ids=input_ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
        return torch.gather(h, 1, read.unsqueeze(-1).expand(-1, -1, h.shape[-1]))

    def real_token_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """The LM head's rows of the real tokens (B5 real tokens only); the tensor itself when that is all of it."""
        # no slice when none is needed: its backward would fill a fresh [V, d] gradient with zeros and copy into it
        return weight if weight.shape[0] == self.n_vocab else weight[: self.n_vocab]

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., d] hidden -> [..., n_vocab] float32 logits over the real tokens only (B5 real tokens only), autocast off
        (--bf16 too)."""
        # OAI lm_human_preferences/policy.py: step_core slices logits to n_vocab
        with full_precision(h.device):
            return self.lm.get_output_embeddings()(h.float())[..., : self.n_vocab].float()

    def head_scalars(self, h: torch.Tensor) -> torch.Tensor:
        """[..., d] hidden -> [...] float32 outputs of the scalar head (values, or rewards before gain and bias),
        autocast off (--bf16 too), as the LM head's logits: a bfloat16 product would round a value of 1 by up to 2^-8."""
        # OAI lm_human_preferences/language/model.py: fc_layer for the heads, float32 as the original computed them
        with full_precision(h.device):
            return self.head(h.float()).squeeze(-1)


class RewardModel(LMWithHead):
    """reward(x, y) = gain * head(h_last) + bias over [query, response] (FIDELITY D1 reward gain and bias)."""

    def __init__(self, lm: nn.Module, pad_id: int):
        super().__init__(lm, pad_id, head="reward")
        # OAI lm_human_preferences/rewards.py: reward_norm gain (1) and bias (0), trained with the model
        self.gain = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, query_responses: torch.Tensor) -> torch.Tensor:
        """[b, t] tokens -> [b] rewards read at the last index (= last real token, B2 last real token)."""
        # OAI lm_human_preferences/rewards.py: RewardModelTrainer._build, reward = lm_output['reward'][:, -1]
        last = torch.full((len(query_responses), 1), query_responses.shape[1] - 1, device=query_responses.device)
        h_last = self.hidden_at(query_responses, last)[:, 0]  # [b, d]
        return self.gain * self.head_scalars(h_last) + self.bias

    def score(self, queries: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """[b, q] queries and [b, r] responses -> [b] rewards of their plain concatenation."""
        # OAI lm_human_preferences/rewards.py: get_rewards_op concatenates the raw queries and responses
        return self(torch.cat([queries, responses], dim=1))

    @torch.no_grad()
    def set_reward_norm(self, old_mean: float, old_std: float, new_mean: float, new_std: float) -> None:
        """Choose gain and bias so rewards with old_mean +- old_std become new_mean +- new_std (D6 normalize before, D7
        normalize after)."""
        # OAI lm_human_preferences/rewards.py: set_reward_norm (expects gain 1, bias 0 beforehand)
        assert self.gain.item() == 1 and self.bias.item() == 0, "reset gain/bias before normalising"
        if not math.isfinite(old_std) or old_std <= 0:
            raise UserError(f"reward std on policy samples is {old_std}; cannot normalise (is the model degenerate?)")
        gain = new_std / old_std
        self.gain.fill_(gain)
        self.bias.fill_(new_mean - gain * old_mean)

    @torch.no_grad()
    def reset_reward_scale(self) -> None:
        """gain = 1, bias = 0."""
        self.gain.fill_(1.0)
        self.bias.fill_(0.0)


class Policy(LMWithHead):
    """The policy: one network with the LM head and a zero-initialised value head (FIDELITY B3 head init, E7 policy loss)."""

    def __init__(self, lm: nn.Module, pad_id: int, temperature: float):
        super().__init__(lm, pad_id, head="value")
        self.temperature = temperature

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[b, t] tokens -> ([b, t, n_vocab] float32 logits, [b, t] values)."""
        h = self.hidden(tokens)
        return self.lm_logits(h), self.head_scalars(h)

    def analyze_responses(self, contexts: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]:
        """Log-probs, entropies and values of given responses, each [b, r] (FIDELITY C3 scoring slice)."""
        # OAI lm_human_preferences/policy.py: analyze_responses_op, logits[:, ctx-1:-1] / temperature
        (b, c), r = contexts.shape, responses.shape[1]
        # the hidden states and the LM head only at the positions that predict response tokens: the same numbers
        # as slicing full logits; the last response token predicts nothing, so it is not fed at all
        query_responses = torch.cat([contexts, responses[:, :-1]], dim=1)  # [b, c + r - 1]
        read = torch.arange(c - 1, c + r - 1, device=contexts.device).expand(b, r)  # [b, r]
        h = self.hidden_at(query_responses, read)  # [b, r, d]
        head = self.lm.get_output_embeddings()
        if getattr(head, "bias", None) is None:
            logprobs, entropies = response_logprobs(h, self.real_token_rows(head.weight), responses, self.temperature)
        else:  # an LM head with a bias: the plain computation
            logits = self.lm_logits(h) / self.temperature  # [b, r, n_vocab]
            logprobs = logprobs_from_logits(logits, responses)
            with torch.no_grad():
                entropies = entropy_from_logits(logits)
        return {"logprobs": logprobs, "entropies": entropies, "values": self.head_scalars(h)}  # [b, r] each

    @torch.no_grad()
    def sample(self, contexts: torch.Tensor, length: int, generator: torch.Generator | None = None,
               uniforms: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Sample exactly ``length`` tokens per context with a KV cache (FIDELITY C1 plain sampling, C2 rollout log-probs and
        values).

        Step t of row i inverts the CDF at ``uniforms[i, t]`` ([b, length] float64, `RankDraws.uniforms`: each
        emulated rank's own noise) when given, else at a fresh uniform from ``generator``.

        Returns responses [b, length], their log-probs under the temperature-scaled logits and the
        values at the positions that predict them, both [b, length].
        """
        # OAI lm_human_preferences/language/sample.py: sample_sequence (no EOS stop, top_k 0, top_p 1)
        input_ids, mask, positions = prepare_inputs(contexts, self.pad_id)
        last = last_real_indices(mask)[:, -1:]  # [b, 1]: B2 last real token, the context's output is its last real token's
        base = self.lm.base_model
        if self.packed:  # GPT-2: the real tokens only, keys and values in a cache preallocated for every step
            # on a GPU the steps are one CUDA graph, replayed for every batch of this shape (step_graph.py)
            graphs = graphs_of(self) if StepGraphs.apply(contexts, uniforms) else None
            shape = (len(contexts), contexts.shape[1] + length, length, base.wte.weight.dtype, contexts.device)

            def new_cache() -> KVCache:
                return KVCache(base, len(contexts), contexts.shape[1] + length, like=base.wte.weight)

            cache = graphs.cache(shape, new_cache) if graphs else new_cache()
            h = packed_hidden(base, input_ids, mask, positions, last, cache)[:, 0]  # [b, d]

            def steps(h: torch.Tensor, columns: torch.Tensor, uniforms: torch.Tensor | None) -> dict[str, torch.Tensor]:
                def advance(token: torch.Tensor, step: int) -> torch.Tensor:
                    return decode_step(base, token.squeeze(1), columns + step, cache)
                return self._steps(h, advance, length, generator, uniforms)

            columns = mask.sum(1)  # [b] the next token's column = its position id (real tokens so far)
            if graphs:
                return graphs.run(shape, steps, h, columns, uniforms, list(self.parameters()))
            return steps(h, columns, uniforms)
        # another causal LM: its own forward and cache
        out = base(input_ids=input_ids, attention_mask=mask.long(), position_ids=positions, use_cache=True)
        h = out.last_hidden_state.gather(1, last[..., None].expand(-1, -1, out.last_hidden_state.shape[-1]))[:, 0]
        past, attn = out.past_key_values, mask.long()
        next_position = mask.sum(1, keepdim=True)  # [b, 1]: real tokens so far

        def advance(token: torch.Tensor, step: int) -> torch.Tensor:
            nonlocal past, attn
            attn = torch.cat([attn, torch.ones_like(token)], dim=1)
            out = base(input_ids=token, attention_mask=attn, position_ids=next_position + step,
                       past_key_values=past, use_cache=True)
            past = out.past_key_values
            return out.last_hidden_state[:, -1]
        return self._steps(h, advance, length, generator, uniforms)

    def _steps(self, h: torch.Tensor, advance, length: int, generator: torch.Generator | None,
               uniforms: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The sampling loop from the context's [b, d] final hidden state: draw, log-prob and value, then
        ``advance(token, step)`` -> the next [b, d] hidden state."""
        head = self.lm.get_output_embeddings()
        responses, logprobs, values = [], [], []
        for step in range(length):
            u = None if uniforms is None else uniforms[:, step : step + 1]  # [b, 1]
            if getattr(head, "bias", None) is None:  # GPT-2's tied head; B5 real tokens only
                token, logprob = sample_step(h, self.real_token_rows(head.weight), self.temperature, generator, u)
            else:  # an LM head with a bias: the plain computation
                logits = self.lm_logits(h) / self.temperature  # [b, n_vocab], float32
                token = sample_categorical(logits, generator, u)  # [b, 1]
                logprob = logprobs_from_logits(logits[:, None], token)  # [b, 1]
            responses.append(token)
            logprobs.append(logprob)
            values.append(self.head_scalars(h)[:, None])  # [b, 1]
            if step < length - 1:  # the last token predicts nothing: no forward pass for it
                h = advance(token, step)  # [b, d]
        return {
            "responses": torch.cat(responses, 1),  # [b, length]
            "logprobs": torch.cat(logprobs, 1),  # [b, length]
            "values": torch.cat(values, 1),  # [b, length]
        }


# ---------------------------------------------------------------------------------------------
# Saved models: the LM in Hugging Face format (loadable by AutoModelForCausalLM, a reward model also by
# AutoModelForSequenceClassification: interop.py) + the tokenizer + the scalar head (and the reward model's gain and
# bias) + the hparams used + the model card.
HEAD_FILE = "head.safetensors"
OLD_HEAD_FILE = "head.pt"  # a pickle: directories saved before safetensors still load
HPARAMS_FILE = "hparams.json"


def head_file(path: str | Path) -> Path | None:
    """The head file of a saved model directory (safetensors, else an older directory's head.pt), or None."""
    return next((Path(path) / f for f in (HEAD_FILE, OLD_HEAD_FILE) if (Path(path) / f).is_file()), None)


def save_model_dir(path: str | Path, model: LMWithHead, tokenizer, hparams: dict, replace: bool = True, *,
                   metrics: dict | None = None, tracked: str | None = None, datasets: list[str] | None = None) -> None:
    """Write ``model`` to the directory ``path`` atomically (FIDELITY D8 saved gain and bias: gain and bias included),
    with its card (``metrics``: the run's last logged values, ``tracked``: its W&B URL); ``replace=False``: a cache
    entry, kept if a concurrent writer published it first; else a directory there is replaced only where it is the
    project's own, a run's entry or the cache's (outputs.atomic_dir)."""
    try:
        with atomic_dir(path, replace=replace) as tmp:
            write_model_files(tmp, model, tokenizer, hparams, metrics=metrics, tracked=tracked, final=path,
                              datasets=datasets)
    except OSError as e:  # a full disk, a directory made read-only during the run: nothing half-written is left
        raise UserError(f"cannot save {path} ({e.strerror or e}); free some disk space or pass another --output-dir") from None


def write_model_files(directory: Path, model: LMWithHead, tokenizer, hparams: dict, *, metrics: dict | None = None,
                      tracked: str | None = None, final: str | Path | None = None,
                      datasets: list[str] | None = None) -> None:
    """The files of a saved model (`save_model_dir`) written into ``directory``, a new one the caller holds (a
    temporary that utils/outputs.py puts in place at ``final``, which the files' paths are written relative to)."""
    from safetensors.torch import save_file  # with transformers: a flag's error line never waits for it

    kind = "reward" if isinstance(model, RewardModel) else "policy"
    hparams = portable_paths(hparams, Path(final or directory))  # no machine's directories in what a Hub push sends
    score = reward_score(model.head, model.gain, model.bias) if kind == "reward" else None
    # other code pads with EOS (a policy on the left); our [PAD] stays training's (interop.py)
    length = (hparams.get("task") or {}).get("response_length")
    sampling = None if score else policy_sampling(model.temperature, length)  # the task's, for `generate`
    offset = save_plain_lm(model.lm, directory, plain_pad_id(tokenizer), score, sampling)  # the reward's constant left: 0
    save_plain_tokenizer(tokenizer, directory, model.lm.get_input_embeddings().weight.shape[0], kind)
    # the heads, and a reward model's final-norm bias as trained: the weights' one has the offset folded in
    kept = {f"lm.{final_norm_bias(model.lm)}"} if score else set()
    head = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
            if not k.startswith("lm.") or k in kept}
    save_file(head, directory / HEAD_FILE, metadata={"format": "pt"})
    (directory / HPARAMS_FILE).write_text(json.dumps(hparams, indent=2, default=str))
    write_card(directory, kind, hparams, metrics=metrics, tracked=tracked, reward_offset=offset, datasets=datasets)


SAVED_BY = {"reward": ("train_reward.py", "reward_model"), "policy": ("train_policy.py", "policy")}


def check_saved_model(path: str | Path, kind: str, flag: str = "") -> dict:
    """A directory `save_model_dir` wrote for a ``kind`` model, checked without loading it -> its hparams."""
    path = Path(path).expanduser()
    name = f"{flag} {path}".strip()
    script, folder = SAVED_BY[kind]
    advice = f"pass the {folder}/ directory that {script} saved"
    if not path.is_dir():
        why = "not a directory" if path.exists() else "it does not exist"
        raise UserError(f"{name} is not a saved {kind} model directory ({why}); {advice}")
    try:
        hparams = json.loads((path / HPARAMS_FILE).read_text()) if (path / HPARAMS_FILE).is_file() else {}
    except (OSError, ValueError) as e:
        raise UserError(f"{name}: {HPARAMS_FILE} is not readable JSON ({e}); copy the directory again or run {script} "
                        "again") from None
    # what saved it: a policy run's hparams hold its PPO settings, a reward run's its labels
    saved = "policy" if "ppo" in hparams else "reward" if "labels" in hparams else None
    if saved not in (None, kind):
        raise UserError(f"{name} is a saved {saved} model ({SAVED_BY[saved][0]}), not a {kind} model; {advice}")
    missing = [f for f in ("config.json", HPARAMS_FILE) if not (path / f).is_file()] + ([] if head_file(path) else [HEAD_FILE])
    if missing:
        raise UserError(f"{name} is not a saved {kind} model directory (missing {', '.join(missing)}); {advice}")
    check_model_files(path, flag, f"copy the whole directory {script} saved again, or run {script} again")
    return hparams


def read_head(path: Path) -> dict[str, torch.Tensor]:
    """The head tensors of a head.safetensors, or of an older directory's head.pt (read with weights_only)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file  # with transformers: a flag's error line never waits for it

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model_dir(path: str | Path, kind: str, device: str | torch.device = "cpu",
                   **kwargs) -> tuple[LMWithHead, object, dict]:
    """Read a directory written by `save_model_dir` -> (model, tokenizer, hparams); kind is 'reward' or 'policy'.

    A missing, incomplete, corrupt or other-kind directory raises a one-line UserError.
    """
    path = Path(path)
    hparams = check_saved_model(path, kind)
    try:
        head = read_head(head_file(path))
        if kind == "reward" and isinstance(head, dict) and "head.weight" in head and "gain" not in head:
            raise UserError(f"{path} is a saved policy model (its head has no reward gain and bias), not a reward model; "
                            f"pass the {SAVED_BY[kind][1]}/ directory that {SAVED_BY[kind][0]} saved")
        tokenizer = load_tokenizer(str(path))
        lm = load_lm(str(path), quiet=True)
        model = RewardModel(lm, tokenizer.pad_token_id) if kind == "reward" else Policy(lm, tokenizer.pad_token_id, **kwargs)
        missing_keys, unexpected = model.load_state_dict(head, strict=False)
        if unexpected or any(not k.startswith("lm.") for k in missing_keys):
            raise ValueError(f"head file does not match a {kind} model")
    except UserError:
        raise
    except Exception as e:  # a corrupt or truncated file: name the directory, no traceback
        raise UserError(f"{kind} model directory {path} is corrupt ({type(e).__name__}: {str(e)[:200]}); "
                        f"run {SAVED_BY[kind][0]} again") from None
    return model.to(device), tokenizer, hparams
