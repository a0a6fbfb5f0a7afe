"""The offline task (`--task offline`): the whole method on a laptop CPU, with a programmatic labeller in place of
people, and the tiny model and labels it ships.

    task.py       the corpus and gold scorer, pretraining, the assets and their shipping, evaluation and report
    assets/       the recipe's tiny GPT-2 and its labels, as `build_assets` made them
"""
