"""The original's MPI ranks: R emulated ranks, each with its own seeds and draws, spread over W torchrun processes,
and what the processes of one job must agree on.

    emulated.py   `Ranks`: which ranks this process holds, their generators, reductions over all ranks
    gradients.py  one optimizer step's gradient over the ranks' blocks, micro-batch by micro-batch
    failures.py   every process says whether it failed at the same point; all fail together
    devices.py    --device checked against this torch, and 'auto' decided once
"""
