"""The paper's evaluations (section 3 and 4): policies compared blind by people (or programs), a majority of three
deciding each item, and the summarisation tasks' ROUGE table.

    items.py     the policies named by --policies, sampled on the same held-out queries with the same seed, and every
                 pair of their responses in an order drawn at random and recorded
    judges.py    who labels: the gold scorer, a command (the `ID BEST` protocol), or people on the labelling page
    results.py   win rates by majority with their 95% intervals, single labels, position bias, agreement; the table,
                 the picture and the comparisons as a Hugging Face dataset
    rouge.py     ROUGE-1/2/L F1 of responses against reference summaries, and the lead-3 baseline
"""
