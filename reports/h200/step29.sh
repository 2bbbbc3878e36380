#!/usr/bin/env bash
# On the lent 2 x H200 machine (cuda:0 only): the draft body graph as measure times it against the
# decoder's body graph and the pieces in between (reports/h200/session5/draft_body_variants.py).
source reports/h200/setup.sh
timeout 300 python3 reports/h200/session5/draft_body_variants.py 2>&1 | grep -v Warn | tee $R/draft_body_variants.txt
