"""The command line both scripts share: from argv to a checked Args, and the process's end.

    parsing.py    `--task NAME` picks a preset, tyro parses the flags over it; a parse error is one line; `run_script`,
                  both scripts' main(): parse, check, train, leave torchrun's process group
    run_args.py   `RunArgs`, the run options both scripts take, their checks and the finalize step
"""
