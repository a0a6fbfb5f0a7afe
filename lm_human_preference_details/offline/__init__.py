"""The offline task (`--task offline`): the whole method on a laptop CPU, with a programmatic labeller in place of
people, and the tiny model and labels it ships.

    task.py       the preset (and its online variant) with its hooks: the gold-score metric, the report
    corpus.py     the corpus of templated passages, the gold scorer, the preset's sizes
    pretrain.py   the tiny GPT-2 pretrained on the corpus, and its best-of-4 labels
    assets.py     the recipe that builds the assets, the copy the package ships, the cache entry
    report.py     the end-of-run report: gold and reward-model scores on held-out queries
    assets/       the recipe's tiny GPT-2 and its labels, as `build_assets` made them
"""
