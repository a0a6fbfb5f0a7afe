"""Shared pieces of the PyTorch reproduction of openai/lm-human-preferences; each module has one job.

Command line and files:  ``cli`` (run options, micro-batches, one-line errors),
``ranks`` (the emulated ranks, torchrun), ``tasks`` (presets, ``--task``),
``files`` (cache directory, atomic writes), ``downloads`` (cached, checked, retried downloads).
Data:  ``tokenizer`` (GPT-2 with a distinct pad), ``labels`` (OpenAI's label files), ``queries`` (a subpackage:
query sources, per-rank streams, query processing and the query samplers).
Model:  ``model`` (Policy, RewardModel, save/load), ``gpt2`` (packed GPT-2 forward, KV cache), ``lm_head`` (sampling
step, chunked log-probs).
Training:  ``ppo`` (the PPO maths), ``optim`` (TF-1 Adam), ``tracking`` (TensorBoard, metrics.jsonl, W&B),
``checkpoint`` (training checkpoints, resume, stop signals, the non-finite guard).
Tools:  ``sample`` (sample and score a policy), ``oai_checkpoints`` (OpenAI's released TF checkpoints).
The offline demo task:  ``offline``.
"""
