"""Real end-to-end runs of the decoder against the simulator's predictions on the same profile and the
run's own trace, beside the study's closed form (`python -m validate`); `--peers` compares with Hugging
Face's own generation on the same weights; `--from-runs` predicts recorded runs again."""
