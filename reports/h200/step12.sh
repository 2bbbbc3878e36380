#!/usr/bin/env bash
# On one lent H200: the AWQ GEMM with its tile dequantized in PTX (lop3 pairs) and FlashHead's select
# with one wide load for tie ranks: GPU tests, the FlashHead bench, then the AWQ launch sweep.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 150 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py tests/test_model_awq.py -q -x -rs \
  -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
timeout 120 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep -v "^centroids\|^SELECT\|^stage2\|^  "
timeout 280 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json --budget-s 200 2>&1 | grep -v Warn | tee $R/awq_sweep.txt | grep -v "^    \|^  [BCD]"
