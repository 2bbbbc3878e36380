#!/usr/bin/env bash
# On the lent 2 x H200 machine: the fused Triton layer kernels, FlashHead stage 1 and the w4a16 GEMM.
# GPU tests, per-operation speed against floors, exactness of every schedule on the study's pair with
# the fused kernels, and the AWQ cost profile measured with them.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 170 python3 -m pytest tests/test_triton_kernels.py tests/test_model_decoder_gpu.py tests/test_model_flashhead.py \
  tests/test_model_awq.py -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt
timeout 150 python3 reports/h200/speed_bench.py --out $R/speed_bench.json 2>&1 | grep -v Warn | tee $R/speed_bench.txt
P="--prompts 81,101,161,401 --prompts-file .carry/question.jsonl --max-new-tokens 64 --K 6 --placement two-gpu --check-exact"
for head in dense flashhead; do
  timeout 100 python3 -m model --target qwen3-32b --draft qwen3-0.6b --head $head --schedule all --acceptance a=0.8 $P \
    --out $R/exact-$head 2>&1 | grep -v Warning | tee $R/exact-$head.txt
done
timeout 150 python3 -m measure --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --reps 10 --warmup 2 \
  --prompts-file .carry/question.jsonl --out $R/qwen3-32b-awq_qwen3-0.6b_two-gpu.json 2>&1 | tail -2
