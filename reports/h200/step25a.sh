#!/usr/bin/env bash
# On the lent 2 x H200 machine, the session-5 code (planes AWQ GEMM, attention 16 rows per program):
# GPU tests (Triton kernels, FlashHead, AWQ, decoder exactness), per-operation speed against floors
# with Hugging Face eager in the same run, then FlashHead's kernels (launch sweep, per-kernel profile,
# heads in a graph, draft step with each head).
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $R/env.txt
timeout 150 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py tests/test_model_awq.py \
  tests/test_model_decoder_gpu.py -q -x -rs -p no:cacheprovider > $R/gpu_tests.txt 2>&1
tail -4 $R/gpu_tests.txt
timeout 290 python3 reports/h200/speed_bench.py --out $R/speed_bench.json 2>&1 | grep -v Warn | tee $R/speed_bench.txt
timeout 110 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep -v "^centroids\|^SELECT\|^stage2"
