#!/usr/bin/env bash
# On the lent 2 x H200 machine: the bf16 cost profile, the Hugging Face eager reference, and
# predicted vs measured for the dense draft head (every schedule, K = 6) on two GPUs.
source reports/h200/setup.sh
timeout 100 python3 -m measure --target qwen3-32b --draft qwen3-0.6b --placement two-gpu --reps 10 --warmup 2 \
  --prompts-file .carry/question.jsonl --out $R/qwen3-32b_qwen3-0.6b_two-gpu.json 2>&1 | grep wrote
timeout 60 python3 -m measure.hf_eager --model qwen3-0.6b --model qwen3-32b --device cuda:0 --out $R/hf_eager.json
timeout 200 python3 -m validate --profile .carry/awq_step2.json --target qwen3-32b-awq --draft qwen3-0.6b \
  --placement two-gpu --schedules all --heads dense --K 6 --acceptance a=0.77 \
  --prompts 81,91,101,111,121,141,161,401 --n-prompts 8 --max-new-tokens 64 --prompts-file .carry/question.jsonl \
  --out $R/validation-two-gpu-dense 2>&1 | grep -v "it/s\|s/it" | tail -12
