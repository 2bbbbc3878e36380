#!/usr/bin/env bash
# On the lent 2 x H200 machine, the session-5 code (planes AWQ GEMM, attention 16 rows per program):
# end to end at the study's acceptance (AWQ target, K = 6, acceptance control a = 0.77), every
# schedule and both heads, exactness checked against target-only greedy, with phase shares; then the
# two-gpu cost profile.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
P="--prompts 81,91,101,111,121,141,161,401 --prompts-file .carry/question.jsonl --max-new-tokens 64 --K 6 \
   --placement two-gpu --acceptance a=0.77 --check-exact"
for head in dense flashhead; do
  timeout 150 python3 -m model --target qwen3-32b-awq --draft qwen3-0.6b --head $head --schedule all $P \
    --out $R/e2e/$head 2>&1 | grep -v Warning | tee $R/e2e-$head.txt
done
python3 reports/h200/phase_shares.py $R/e2e/dense $R/e2e/flashhead | tee $R/e2e-shares.txt
timeout 120 python3 -m measure --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --graphs on --k-max 8 \
  --contexts 104,280 --prompt-lengths 103,200 --reps 8 --warmup 2 --prompts-file .carry/question.jsonl \
  --out $R/profile-two-gpu.json 2>&1 | tail -2
