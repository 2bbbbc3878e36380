#!/usr/bin/env bash
# On one lent H200: FlashHead with hidden-size loops unrolled and one probed cluster per stage-2
# program: GPU tests, then the FlashHead bench with its launch sweep.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 150 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py -q -x -rs \
  -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
timeout 150 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep -v "^centroids\|^SELECT\|^stage2\|flashhead p=.* torch  \|dense  "
