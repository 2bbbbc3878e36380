#!/usr/bin/env bash
# On the lent 2 x H200 machine: the two-GPU cost profile with the decode steps (target forwards, draft
# body, heads) timed back to back (measure/timing.py's back_to_back option of commit 0b7c6cf, since
# reverted), with validate --measure's arguments; the validation's recorded runs (step26) were then
# predicted again from it with python -m validate --from-runs. Record:
# reports/h200/session5/intermediate/profile_step27_back_to_back.{json,md}.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,temperature.gpu,clocks.sm --format=csv > $R/env.txt
timeout 300 python3 -m measure --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --graphs on --k-max 8 \
  --contexts 104,280 --prompt-lengths 103,200 --seed 0 --prompts-file .carry/question.jsonl --reps 8 --warmup 2 \
  --out $R/profile-two-gpu.json 2>&1 | tail -2
