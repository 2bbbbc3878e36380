#!/usr/bin/env bash
# On one lent H200: the AWQ GEMM with two K steps per loop iteration (paired; an option since removed, no gain): its GPU
# tests, then the launch sweep with stage F.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 100 python3 -m pytest tests/test_triton_kernels.py -k awq -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -2 $R/gpu_tests.txt
timeout 300 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json --budget-s 240 2>&1 | grep -v Warn | tee $R/awq_sweep.txt | grep -v "^    \|^  [BCDE]"
