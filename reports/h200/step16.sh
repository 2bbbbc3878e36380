#!/usr/bin/env bash
# On one lent H200: the AWQ GEMM with split-K summed by each tile's last split (no second launch) and
# AWQLinear's column blocks: GPU tests (kernels, FlashHead, AWQ, decoder exactness), then the AWQ sweep.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 200 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py tests/test_model_awq.py \
  tests/test_model_decoder_gpu.py -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt
timeout 280 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json --budget-s 220 2>&1 | grep -v Warn | tee $R/awq_sweep.txt | grep -v "^    \|^  [BCDE]"
