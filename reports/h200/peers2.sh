#!/usr/bin/env bash
# On the lent 2 x H200 machine, fused kernels: this project's decoder side by side with Hugging Face
# generate and assisted generation, same synthetic qwen3-32b (bf16, cuda:0) + qwen3-0.6b weights,
# our draft on cuda:1 (HF's assisted generation keeps both models on one device).
source reports/h200/setup.sh
timeout 290 python3 -m validate --peers --target qwen3-32b --draft qwen3-0.6b --placement two-gpu --K 6 \
  --schedule deferred --prompts 81,101,161,401 --n-prompts 4 --max-new-tokens 64 \
  --prompts-file .carry/question.jsonl --out $R/peers-two-gpu 2>&1 | grep -v "it/s\|s/it\|Warning" | tail -30
