# A CUDA GPU box image that installs the project and runs either script:
#   docker build -t lmhp .
#   docker run --gpus all -e WANDB_API_KEY lmhp python train_policy.py --task sentiment --track
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /workspace/lm-human-preference-details
ENV PYTHONUNBUFFERED=1 HF_HOME=/workspace/cache/hf LMHP_CACHE=/workspace/cache/lmhp
# a C compiler: torch.compile (--compile) builds Triton's launcher with one, and the runtime image has none
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY lm_human_preference_details ./lm_human_preference_details
COPY train_reward.py train_policy.py ./
RUN pip install --no-cache-dir -e ".[test]"
COPY tests ./tests
COPY benchmarks ./benchmarks
VOLUME ["/workspace/cache", "/workspace/lm-human-preference-details/runs"]
CMD ["python", "train_policy.py", "--help"]
