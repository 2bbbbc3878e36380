#!/usr/bin/env bash
# On one lent H200: after the review refactor of model/flashhead_triton.py (one dot-product helper for the
# centroid and stage-2 kernels, one load of the call count per kernel): GPU tests, then the FlashHead bench.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 120 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py -q -x -rs -p no:cacheprovider \
  > $R/gpu_tests.txt 2>&1
tail -2 $R/gpu_tests.txt
timeout 150 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep "^head\|x1  _\|==\|dense / this"
