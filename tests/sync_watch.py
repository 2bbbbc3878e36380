"""One decode under CUDA's sync debug mode, for the tests that every host sync is a round read."""

import warnings

import pytest
import torch

from model import schedules


def decode_watching_syncs(decoder, prompt, max_new: int, schedule: str):
    """(the synchronizing calls CUDA's sync debug mode flagged, the decoder's round reads, the
    generation) of one run of `schedule`; the mode is on only inside the schedule's decode loop."""
    reads = []
    read, decode = decoder.read, schedules.RUNNERS[schedule]

    def counted(*values):
        reads.append(values)
        return read(*values)

    def watched(d, run):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            decode(d, run)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr(decoder, "read", counted)
        patch.setitem(schedules.RUNNERS, schedule, watched)
        warnings.simplefilter("always")
        generation = decoder.generate(prompt, max_new, schedule)
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    return syncs, reads, generation
