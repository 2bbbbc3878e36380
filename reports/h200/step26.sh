#!/usr/bin/env bash
# On the lent 2 x H200 machine, the session-5 code (planes AWQ GEMM): predicted vs measured
# (python -m validate) for synthetic qwen3-32b-awq + qwen3-0.6b on two GPUs, both draft heads, every
# schedule, K = 2, 4, 6, 8, the profile measured in the same run after the real runs (--measure).
source reports/h200/setup.sh
timeout 570 python3 -m validate --measure --measure-args "--reps 8 --warmup 2" --target qwen3-32b-awq --draft qwen3-0.6b \
  --placement two-gpu --schedules all --heads dense,flashhead --K 2,4,6,8 --acceptance a=0.77 \
  --prompts 81,91,101,111,121,141,161,401 --n-prompts 8 --max-new-tokens 64 --prompts-file .carry/question.jsonl \
  --out $R/validation-two-gpu 2>&1 | grep -v "it/s\|s/it\|Warning" | tail -50
