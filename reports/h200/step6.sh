#!/usr/bin/env bash
# On the lent 2 x H200 machine, with the fused kernels: the AWQ cost profiles for two-gpu (step5.sh's runs
# ran out of time before theirs) and one-gpu, then predicted vs measured on one GPU (FlashHead draft,
# every schedule, K = 2, 4, 6, 8). Contexts and prompt lengths are those validate --measure picks for
# these 8 prompts.
source reports/h200/setup.sh
M="--target qwen3-32b-awq --draft qwen3-0.6b --graphs on --k-max 8 --contexts 104,280 --prompt-lengths 103,200 \
   --reps 8 --warmup 2 --prompts-file .carry/question.jsonl"
timeout 110 python3 -m measure $M --placement two-gpu --out $R/profile-two-gpu.json 2>&1 | grep wrote
timeout 110 python3 -m measure $M --placement one-gpu --out $R/profile-one-gpu.json 2>&1 | grep wrote
timeout 330 python3 -m validate --profile $R/profile-one-gpu.json --target qwen3-32b-awq --draft qwen3-0.6b \
  --placement one-gpu --schedules all --heads flashhead --K 2,4,6,8 --acceptance a=0.77 \
  --prompts 81,91,101,111,121,141,161,401 --n-prompts 8 --max-new-tokens 64 --prompts-file .carry/question.jsonl \
  --out $R/validation-one-gpu 2>&1 | grep -v "it/s\|s/it\|Warning" | tail -30
