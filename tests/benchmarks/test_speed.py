"""benchmarks/speed.py's straightforward reference update does the same maths as ours, so its timings compare like with like.

Ours (Policy.analyze_responses: LM head at the response positions, chunked log-probs; train_policy.ppo_epochs)
against the benchmark's plain Hugging Face version (left padding, full-vocabulary logits at every position).
"""

from __future__ import annotations

import pytest
import torch

import train_policy
from benchmarks import speed
from lm_human_preference_details.language.model import Policy, RewardModel, load_lm
from lm_human_preference_details.optim import TF1Adam
from lm_human_preference_details.ranks.emulated import Ranks

PAD = 50257


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    torch.manual_seed(0)
    p = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    torch.nn.init.normal_(p.head.weight, std=0.1)  # a non-zero value head, so values and their gradients count
    return p


def _contexts(n: int = 16) -> torch.Tensor:
    """[n, 8] contexts as format_queries builds them: prefix, right-padded query, suffix -> pads in the middle."""
    torch.manual_seed(3)
    contexts = torch.randint(0, 50257, (n, 8))
    contexts[::2, 4:6] = PAD
    contexts[1::3, 3:7] = PAD
    return contexts


def test_left_pad_by_hand():
    tokens = torch.tensor([[5, PAD, 7, PAD, 9], [1, 2, 3, 4, PAD]])
    input_ids, mask = speed.left_pad(tokens, PAD)
    assert input_ids.tolist() == [[0, 0, 5, 7, 9], [0, 1, 2, 3, 4]]
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]


def test_straightforward_analysis_equals_analyze_responses(policy):
    contexts = _contexts()
    responses = torch.randint(0, 50257, (len(contexts), 5))
    with torch.no_grad():
        ours = policy.analyze_responses(contexts, responses)
        plain = speed.straightforward_analyze(policy, *speed.left_pad(contexts, PAD), responses)
    for key in ("logprobs", "entropies", "values"):
        torch.testing.assert_close(plain[key], ours[key], atol=2e-5, rtol=1e-5, msg=key)


def test_straightforward_score_equals_reward_model(tiny_model_dir):
    torch.manual_seed(1)
    reward_model = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    queries = _contexts(6)
    responses = torch.randint(0, 50257, (6, 5))
    responses[:3, 3:] = PAD  # truncated: the reward is read at the last real token
    with torch.no_grad():
        ours = reward_model.score(queries, responses)
        plain = speed.straightforward_score(reward_model, *speed.left_pad(queries, PAD), responses)
    torch.testing.assert_close(plain, ours, atol=1e-5, rtol=1e-5)


def test_generate_samples_from_the_policy_distribution(policy):
    # generate's per-step scores are the plain temperature-scaled logits over all 50257 tokens (no top-k, EOS
    # not masked) and its left padding gives the same logits as our masked forward
    contexts = _contexts(4)
    input_ids, mask = speed.left_pad(contexts, PAD)
    out = policy.lm.generate(input_ids=input_ids, attention_mask=mask, **speed.generate_kwargs(5, 0.7, PAD),
                             output_scores=True, output_logits=True, return_dict_in_generate=True)
    responses = out.sequences[:, contexts.shape[1]:]
    assert responses.shape == (4, 5)
    logits = torch.stack(out.logits, 1).float()  # [4, 5, V]
    torch.testing.assert_close(torch.stack(out.scores, 1), logits / 0.7)
    with torch.no_grad():
        ours = policy.analyze_responses(contexts, responses)["logprobs"]
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, responses[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=1e-5)


def _ppo_args() -> train_policy.Args:
    args = train_policy.build_args("sentiment")
    args.ppo.batch_size, args.ppo.noptepochs, args.ppo.nminibatches, args.num_ranks = 16, 2, 1, 2
    return args.finalize(check_inputs=False)


def test_ppo_update_is_the_same(tiny_model_dir):
    results = []
    for run_epochs in (train_policy.ppo_epochs, speed.straightforward_ppo_epochs):
        torch.manual_seed(0)
        policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
        torch.nn.init.normal_(policy.head.weight, std=0.1)
        before = [p.detach().clone() for p in policy.parameters()]
        torch.manual_seed(4)
        contexts = _contexts()
        data = {"contexts": contexts, **policy.sample(contexts, 5), "rewards": torch.randn(len(contexts), 5)}
        args = _ppo_args()
        stats = run_epochs(policy, TF1Adam(policy.parameters(), lr=1e-3), data, args, Ranks(args.num_ranks, seed=0))
        grads = [p.grad.clone() for p in policy.parameters()]  # the last minibatch's gradients
        updates = [p.detach() - b for p, b in zip(policy.parameters(), before)]
        results.append((data, stats, grads, updates))
    (d_ours, s_ours, g_ours, u_ours), (d_plain, s_plain, g_plain, u_plain) = results
    assert torch.equal(d_ours["responses"], d_plain["responses"])  # the same rollout
    assert len(s_ours) == len(s_plain) == 2
    assert s_ours[1]["policy/approxkl"] > 0  # the second epoch sees a moved policy
    for a, b in zip(s_ours, s_plain):
        for k in b:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    for a, b in zip(g_ours, g_plain):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-3)
    for a, b in zip(u_ours, u_plain):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-3)


def test_matmul_flops_by_hand():
    # 1 block, d 2, MLP 8, vocabulary 3: a token's forward 2 * (12 + 4 + 32) = 96, the last block after qkv 72,
    # the head 12. One query [5, PAD] (1 real token), 2 response tokens, 1 PPO epoch.
    from transformers import GPT2Config

    config = GPT2Config(n_layer=1, n_embd=2, n_inner=8, vocab_size=3, n_head=1)
    flops = speed.matmul_flops(config, torch.tensor([[5, PAD]]), response_length=2, noptepochs=1)
    # reference: generate (2 + 1) * 96 + 2 * 12 = 312; full forward 4 * (96 + 12) = 432, twice; reward 4 * 96;
    # one epoch 3 * 432
    assert flops["reference"] == 312 + 2 * 432 + 384 + 3 * 432
    # ours: sample (1 + 1) * 96 + 2 * 12 = 216; analyze 2 * 96 - 0 * 72 + 2 * 12 = 216; reward 3 * 96 - 2 * 72 = 144
    assert flops["ours"] == 216 + 216 + 144 + 3 * 216


def test_default_reference_micro_batch():
    # on a GPU the reference's full-vocabulary logits of 512 episodes ran out of 80 GB: 128 per forward pass there
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert speed.default_reference_micro_batch(cuda, 512, 0) == 128
    assert speed.default_reference_micro_batch(cuda, 512, 64) == 64  # --micro-batch-sequences, when given, for both
    assert speed.default_reference_micro_batch(cuda, 128, 0) == 0  # one forward pass of 128 already
    assert speed.default_reference_micro_batch(cuda, 200, 8) == 8  # 128 does not divide 200
    assert speed.default_reference_micro_batch(cpu, 512, 0) == 0
    assert speed.default_reference_micro_batch(cpu, 64, 16) == 16


def test_out_is_a_new_file_or_a_table_of_ours_and_nothing_else_is_touched(tmp_path, capsys):
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    with pytest.raises(SystemExit) as e:  # before any model is built
        speed.main(["--device", "cpu", "--sizes", "tiny", "--out", str(mine)])
    assert e.value.code == 2 and mine.read_text() == "my notes\n"
    err = capsys.readouterr().err
    assert err.startswith("error: --out ") and "no run of speed.py wrote it" in err and err.count("\n") == 1
    assert speed.is_our_report(tmp_path / "notes.md") is False
    (tmp_path / "table.md").write_text("| model | batch | path | sample | policy fwd |\n")
    assert speed.is_our_report(tmp_path / "table.md")
