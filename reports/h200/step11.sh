#!/usr/bin/env bash
# On one lent H200: FlashHead with histograms built by the centroid kernel, atomic slot selection and
# stage 2's last program writing the token (4 launches): GPU tests, then the head bench and its sweep.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 120 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py -q -x -rs -p no:cacheprovider \
  > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
timeout 200 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep -v "^centroids\|^SELECT\|^stage2"
