#!/usr/bin/env bash
# On one lent H200: the planes AWQ GEMM (model/awq_triton.py) as integrated: GPU tests of the Triton
# kernels, AWQ and decoder exactness, its launch sweep, and the per-kernel profile of the synthetic 32B
# AWQ forward of 8 tokens.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 200 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py tests/test_model_awq.py \
  tests/test_model_decoder_gpu.py -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt
timeout 250 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json --budget-s 200 2>&1 | grep -v Warn | tee $R/awq_sweep.txt | grep -v "^    "
timeout 100 python3 reports/h200/session5/awq_profile.py > $R/awq_profile.txt 2>&1; grep -v "^ *$" $R/awq_profile.txt | cut -c1-100,150-200 | sed -n 4,12p
