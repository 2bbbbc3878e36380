#!/usr/bin/env bash
# On the lent 2 x H200 machine: graph/GPU checks, exactness of every schedule on the study's pair
# (synthetic qwen3-32b + qwen3-0.6b, bf16, two GPUs), and an AWQ cost profile (not committed: its draft
# timings recorded CUDA events on the wrong device; step2.sh measured the committed one after the fix).
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 90 python3 reports/h200/diag_graphs.py 2>&1 | grep -v Warning | tee $R/diag.txt
timeout 150 python3 -m pytest tests/test_model_decoder_gpu.py tests/test_model_flashhead.py -q -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.txt
P="--prompts 81,101,161,401 --prompts-file .carry/question.jsonl --max-new-tokens 64 --K 6 --placement two-gpu --check-exact"
for head in dense flashhead; do
  timeout 150 python3 -m model --target qwen3-32b --draft qwen3-0.6b --head $head --schedule all --acceptance a=0.8 $P \
    --out $R/exact-$head 2>&1 | grep -v Warning | tee $R/exact-$head.txt
done
timeout 330 python3 -m measure --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --reps 12 --warmup 2 \
  --prompts-file .carry/question.jsonl --out $R/qwen3-32b-awq_qwen3-0.6b_two-gpu.json 2>&1 | tail -3
