"""Real end-to-end runs of the speculative decoder compared with the simulator's predictions (and with
Hugging Face's own generation): `python -m validate`."""
