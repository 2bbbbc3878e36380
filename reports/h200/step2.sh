#!/usr/bin/env bash
# On the lent 2 x H200 machine: the AWQ cost profile, then predicted vs measured (python -m validate)
# for synthetic qwen3-32b-awq + qwen3-0.6b on two GPUs, FlashHead draft, every schedule, K = 2, 4, 6, 8.
source reports/h200/setup.sh
PROFILE=$R/qwen3-32b-awq_qwen3-0.6b_two-gpu.json
timeout 170 python3 -m measure --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --reps 10 --warmup 2 \
  --prompts-file .carry/question.jsonl --out $PROFILE 2>&1 | grep wrote
timeout 400 python3 -m validate --profile $PROFILE --target qwen3-32b-awq --draft qwen3-0.6b \
  --placement two-gpu --schedules all --heads flashhead --K 2,4,6,8 --acceptance a=0.77 \
  --prompts 81,91,101,111,121,141,161,401 --n-prompts 8 --max-new-tokens 64 --prompts-file .carry/question.jsonl \
  --out $R/validation-two-gpu-flashhead 2>&1 | grep -v "it/s\|s/it" | tail -45
