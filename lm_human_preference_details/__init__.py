"""What train_reward.py and train_policy.py share, in folders named for their jobs, as the original lays out its own:
the method at the top, the language model and the data beneath, the machinery of a run below them, utilities last.

    ppo.py          the PPO maths: truncation, rejection, KL rewards, GAE, whitening, losses (pure tensor functions)
    optim.py        TF-1 Adam and the linear learning-rate decay
    tasks.py        the original's four presets (launch.py) and the names --task takes
    label_format.py OpenAI's best-of-4 label files: read, checked, pad 50259 mapped to ours
    sample.py       a command: sample (and score) a policy on held-out queries
    label.py        a command: label best-of-4 samples yourself on a local page
    export.py       a command: label files as a Hugging Face dataset, a reward model in OpenRLHF's format
    agreement.py    a command: how often labellers agree (pairwise, Fleiss' kappa, against gold)
    evaluate.py     a command: the paper's evaluations, policies compared blind by a majority of K labellers

    language/       the language model: tokenizer, GPT-2 forward, LM head, Policy and RewardModel, trained models
    queries/        the query data: sources, per-rank streams, query processing and batches
    ranks/          the original's MPI ranks: emulated ranks on torchrun processes, gradients, agreeing, devices
    run/            a run's life: its directory, checkpoints, stops, tracking, plots
    cli/            the command line: a script's main(), --task and tyro, the run options both scripts take
    labelling/      the label tool's wing: the page, its server, a session over fixed items and its journal
    online/         the paper's online collection: requests while PPO trains, their answers, the label file, retrainings
    evaluation/     the paper's evaluations: blind pairs of responses, who judges them, win rates, ROUGE
    offline/        the offline task: the whole method on a laptop CPU, with its shipped assets
    utils/          beneath everything: files and the cache, downloads, flag checks, progress, how a process ends
"""
