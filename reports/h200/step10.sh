#!/usr/bin/env bash
# On the lent 2 x H200 machine, the final FlashHead kernels (launch shapes as committed): GPU tests, the head
# bench, and the FlashHead end-to-end run at the study's acceptance (AWQ target, K = 6, a = 0.77), exactness checked.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 60 python3 -m pytest tests/test_triton_kernels.py tests/test_model_flashhead.py -q -x -rs -p no:cacheprovider \
  > $R/gpu_tests.txt 2>&1
tail -2 $R/gpu_tests.txt
timeout 120 python3 reports/h200/flashhead_bench.py --out $R/flashhead_bench.json 2>&1 | grep -v Warn | tee $R/flashhead_bench.txt | grep -v "^centroids\|^COUNT\|^SELECT\|^stage2"
P="--prompts 81,91,101,111,121,141,161,401 --prompts-file .carry/question.jsonl --max-new-tokens 64 --K 6 \
   --placement two-gpu --acceptance a=0.77 --check-exact"
timeout 140 python3 -m model --target qwen3-32b-awq --draft qwen3-0.6b --head flashhead --schedule all $P \
  --out $R/e2e/flashhead 2>&1 | grep -v Warning | tee $R/e2e-flashhead.txt
python3 reports/h200/phase_shares.py $R/e2e/flashhead | tee $R/e2e-shares.txt
