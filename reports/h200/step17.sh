#!/usr/bin/env bash
# On one lent H200: the AWQ launch sweep with split-K tickets kept across calls (as AWQLinear keeps them).
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/env.txt
timeout 280 python3 reports/h200/awq_sweep.py --out $R/awq_sweep.json --budget-s 220 2>&1 | grep -v Warn | tee $R/awq_sweep.txt | grep -v "^    \|^  [BCDE]"
