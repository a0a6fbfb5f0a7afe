# Sourced by benchmarks/slurm_*.sbatch (from the repository root): how a Slurm job stops before its time limit and
# comes back. Not run on a Slurm cluster yet; its bash logic is tested with stand-ins for srun and scontrol
# (tests/benchmarks/test_slurm_scripts.py).
#
#   run_then_requeue COMMAND...
# runs the training COMMAND in the background and waits for it, so that this batch shell takes Slurm's signals while
# it trains (bash runs a trap only between commands, and `wait` is one it interrupts):
# - USR1, which `#SBATCH --signal=B:USR1@300` sends to this shell alone 300 s before the time limit: passed on to
#   COMMAND (srun forwards it to its tasks; torchrun, told `--signals-to-handle ...,SIGUSR1`, to its workers). The run
#   finishes its update, saves a checkpoint and exits; this job then requeues itself (`scontrol requeue`, which
#   `#SBATCH --requeue` allows), and the requeued job, started again from the top, continues the run (resume_flag).
# - TERM (scancel, or a preemption: Slurm signals every process of the job itself): passed on too, with no requeue
#   here (a scancel means stop; a preemption with PreemptMode=REQUEUE requeues the job by itself). Without the trap
#   this shell would die at once, and Slurm would kill the job's steps while the run saves.
# Returns COMMAND's exit status.
run_then_requeue() {
    local stop="" status=0
    trap 'stop=USR1; kill -USR1 "$child" 2>/dev/null || true' USR1
    trap 'kill -TERM "$child" 2>/dev/null || true' TERM
    "$@" &
    child=$!
    while kill -0 "$child" 2>/dev/null; do
        wait "$child" || true  # returns early (status > 128) when a trapped signal arrives; the run goes on
    done
    wait "$child" || status=$?
    trap - USR1 TERM
    if [[ -n $stop ]]; then
        echo "stopped by Slurm's USR1 before the time limit (status $status): requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID"
    fi
    return "$status"
}

# --resume for a requeued job (Slurm counts its starts in SLURM_RESTART_COUNT), nothing for the first start: a typo'd
# --output-dir that names an older run is then refused, not continued.
resume_flag() {
    if (( ${SLURM_RESTART_COUNT:-0} > 0 )); then
        echo --resume
    fi
}

# A rendezvous port for this job on its first node, from the job's id: two jobs sharing a node never both take
# torchrun's default 29500.
rendezvous_port() {
    echo $(( 20000 + ${SLURM_JOB_ID:?} % 20000 ))
}
