#!/usr/bin/env bash
# On one lent H200: GPU tests of the Triton kernels, then the launch-shape sweeps of FlashHead's kernels
# (reports/h200/flashhead_bench.py) and of the Triton w4a16 AWQ GEMM (reports/h200/awq_sweep.py).
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 200 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py tests/test_model_awq.py \
  -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt
timeout 170 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt
timeout 190 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json 2>&1 | grep -v Warn | tee $R/awq_sweep.txt
