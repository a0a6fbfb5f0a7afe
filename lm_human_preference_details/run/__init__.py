"""A run's life: the directory it owns, the checkpoints it saves and resumes from, the stops it agrees on, what it
tracks and draws. The algorithm itself is the scripts'.

    lifecycle.py  `Run`: enter the directory, start or resume, hand out updates, save, stop, log
    directory.py  a run directory's rules and lock: whose it is, where a run may start, what --overwrite deletes;
                  the kinds of run (reward, policy, sample): their marker, entries, finished model
    checkpoint.py what a training checkpoint holds; how it is written and read back; the non-finite guard: a NaN
                  ends the run before anything of it is saved
    checksums.py  a checkpoint's SHA256SUMS, written beside it and checked before it loads
    identity.py   what may change on --resume and what may not; the reward model's fingerprint
    saver.py      checkpoints written in a thread from a copy in CPU memory
    signals.py    SIGTERM, SIGINT, SIGUSR1: every process stops after the same update
    tracking.py   config.json, TensorBoard, metrics.jsonl, W&B with --track
    plots.py      curves.png, and runs drawn over a baseline
"""
