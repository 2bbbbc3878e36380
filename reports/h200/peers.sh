#!/usr/bin/env bash
# On one lent H200: this project's decoder side by side with Hugging Face generate and assisted
# generation on the same synthetic qwen3-32b (bf16) + qwen3-0.6b weights.
source reports/h200/setup.sh
timeout 330 python3 -m validate --peers --target qwen3-32b --draft qwen3-0.6b --placement one-gpu --K 6 \
  --schedule deferred --prompts 81,91,101,111,121,141,161,401 --n-prompts 6 --max-new-tokens 64 \
  --prompts-file .carry/question.jsonl --out $R/peers-one-gpu 2>&1 | grep -v "it/s\|s/it\|Warning" | tail -30
