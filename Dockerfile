# A CUDA GPU box image that installs the locked versions (constraints.txt) and runs either script (docs/docker.md):
#   docker build -t lmhp .
#   docker run --gpus all --rm --stop-timeout 120 -v lmhp-cache:/workspace/cache \
#     -v lmhp-runs:/workspace/lm-human-preference-details/runs -e WANDB_API_KEY lmhp python train_policy.py --task sentiment --track
#   docker run --rm lmhp python -m pytest -q          # the test suite, on the CPU
# The named volumes keep GPT-2, the datasets and the offline task's assets (lmhp-cache) and the run directories
# (lmhp-runs) from one container to the next. tini is PID 1, so `docker stop` (SIGTERM) reaches the run at once; the
# run then saves a checkpoint, which may take longer than docker's default 10 s (hence --stop-timeout).
# PyPI's Linux wheel of torch 2.13.0 is its CUDA 13.0 build (2.13.0+cu130; it brings the CUDA runtime as nvidia-*
# wheels, pinned in constraints.txt; the host gives the driver): the host needs an NVIDIA driver >= 580 and a GPU of
# compute capability >= 7.5 (Turing or newer: no V100, no P100), and `--gpus all` needs the NVIDIA Container Toolkit.
FROM python:3.11-slim
WORKDIR /workspace/lm-human-preference-details
ENV PYTHONUNBUFFERED=1 HF_HOME=/workspace/cache/hf LMHP_CACHE=/workspace/cache/lmhp
# a C and C++ compiler, which the slim image lacks: torch.compile (--compile) builds Triton's launcher (GPU) and
# Inductor's C++ kernels (CPU) with them; tini: an init
RUN apt-get update && apt-get install -y --no-install-recommends g++ libc6-dev tini && rm -rf /var/lib/apt/lists/*
# TORCH_CUDA: empty, PyPI's CUDA 13.0 build; cu126 (or another build PyTorch's index has), the same torch release built
# for that CUDA from https://download.pytorch.org/whl/TORCH_CUDA, for drivers older than R580 (docs/docker.md; not run
# on a GPU): docker build --build-arg TORCH_CUDA=cu126 -t lmhp:cu126 .
ARG TORCH_CUDA=
ENV LMHP_TORCH_CUDA=${TORCH_CUDA}
COPY constraints.txt ./
RUN pip install --no-cache-dir -c constraints.txt ${TORCH_CUDA:+--index-url https://download.pytorch.org/whl/$TORCH_CUDA} torch==2.13.0
COPY pyproject.toml README.md ./
COPY lm_human_preference_details ./lm_human_preference_details
COPY train_reward.py train_policy.py ./
RUN pip install --no-cache-dir -c constraints.txt -e ".[test]"
# the rest of the checkout (tests, benchmarks, docs, .ci, this file), so that the test suite runs here as in CI;
# .dockerignore keeps runs/, wandb/, caches and .git out
COPY . .
VOLUME ["/workspace/cache", "/workspace/lm-human-preference-details/runs"]
ENTRYPOINT ["tini", "--", "sh", "-c", "if [ -n \"$LMHP_TORCH_CUDA\" ]; then echo \"lmhp image: torch 2.13.0, $LMHP_TORCH_CUDA build from PyTorch's index (not run on a GPU here): run with --gpus all; without a GPU it can use only the offline task trains (on the CPU)\" >&2; else echo 'lmhp image: torch 2.13.0, CUDA 13.0 build: needs an NVIDIA driver >= 580 and a GPU of compute capability >= 7.5 (no V100/P100), run with --gpus all; without one only the offline task trains (on the CPU)' >&2; fi; exec \"$@\"", "lmhp"]
CMD ["python", "train_policy.py", "--help"]
