#!/usr/bin/env bash
# On the lent 2 x H200 machine: the draft body step timed alone and inside the decoder's draft loop
# (reports/h200/session5/draft_in_loop.py), to find why the loop's steps cost more than the profile.
source reports/h200/setup.sh
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,clocks.max.sm,power.draw --format=csv > $R/env.txt
timeout 400 python3 reports/h200/session5/draft_in_loop.py 2>&1 | grep -v Warn | tee $R/draft_in_loop.txt
nvidia-smi --query-gpu=name,temperature.gpu,clocks.sm,clocks.max.sm,power.draw --format=csv >> $R/env.txt
