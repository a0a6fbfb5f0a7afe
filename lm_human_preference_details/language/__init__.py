"""The language model (the original's `language/`): GPT-2's tokens, its forward pass, and the policy and reward model
built on any Hugging Face causal LM, with the models a flag can name.

    tokenizer.py        GPT-2's byte-level BPE, plus a [PAD] outside its 50257 tokens
    gpt2.py             GPT-2's forward over the real tokens only, and its KV cache
    lm_head.py          the LM head's kernels: the sampling step and chunked log-probs
    step_graph.py       on a GPU, the sampler's token steps captured once as a CUDA graph and replayed
    model.py            `Policy` and `RewardModel` with the original's semantics; saving and loading them
    interop.py          a saved directory as plain transformers and OpenRLHF read it: EOS pads, the reward's `score`
    cards.py            the model card (README.md) of a saved directory: its run, how to load it, its deviations
    model_files.py      a model checked before it loads: its directory, its config
    tf_checkpoint.py    TensorFlow's V2 checkpoints, read without TensorFlow
    oai_checkpoints.py  OpenAI's released TensorFlow runs converted to our model directories
    trained_models.py   a model named by a flag (ours, oai:NAME, a TF run, a Hub model): checked, resolved, loaded
"""
