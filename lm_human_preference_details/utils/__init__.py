"""The floor beneath every wing: files, downloads, a flag's value checks, progress and how a process ends.

    errors.py     UserError and the other ways a process ends; run_main's one line and exit status
    torchrun.py   torchrun's environment, read here only (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE)
    files.py      the cache directory, its build locks, atomic writes; how long a look at a shared directory waits
    random_state.py  the global random generators' state, taken and restored (a checkpoint's, an emulated rank's)
    outputs.py    the one gate of every output a command writes: new, empty, or ours with --overwrite
    downloads.py  a URL fetched once into the cache, atomically, sha256-checked and retried
    checks.py     a flag's value checks, each a one-line UserError, and the paths a flag names
    progress.py   progress bars that stay readable in a log file
"""
