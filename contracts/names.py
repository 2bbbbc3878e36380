"""The vocabulary of the speculative loop: every part spells these names from here."""

# The five schedules, in the order tables list them; `docs/design.md` defines each in words.
SCHEDULES = ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred")
SPECULATIVE_SCHEDULES = SCHEDULES[1:]

# Draft LM heads a cost profile prices (sim, validate, measure); every kind the decoder runs, with
# its budgets, is a head spec of contracts/heads.py.
HEADS = ("dense", "flashhead")

# Drafters: a separate draft model, prompt lookup (the tokens that followed the last n-gram's most
# recent earlier occurrence) and early exit (the target's first L layers and its head).
DRAFTERS = ("draft-model", "prompt-lookup", "early-exit")
# Policies that choose each round's drafter and K (contracts/policies.py); the simulator also
# reports `oracle`, the best fixed arm in hindsight.
POLICIES = ("fixed", "heuristic", "ucb1", "thompson")
SIMULATED_POLICIES = (*POLICIES, "oracle")
# The schedules that take a policy, or a drafter other than a fixed draft model: the deferred ones
# read each round's accepted count at its end (the ordinary ones learn it a round late).
POLICY_SCHEDULES = ("deferred", "pipelined-deferred")

# Where the two models run: target on cuda:0 and draft on cuda:1, both on cuda:0, or the CPU.
PLACEMENTS = ("two-gpu", "one-gpu", "cpu")
# And "tpN" (N >= 2): the target tensor-parallel over N GPUs, one process per GPU (launched by torchrun),
# with the draft on rank 0's GPU. `python -m model` takes it; `measure` adds its costs to a profile's
# `tensor_parallel` section, and the simulator reads them there.
TENSOR_PARALLEL_PLACEMENT = "tpN"


def tensor_parallel_size(placement: str) -> int | None:
    """N of a tensor-parallel placement "tpN" (N >= 2 written plainly, e.g. tp2), else None."""
    ranks = placement.removeprefix("tp")
    if placement.startswith("tp") and ranks.isdigit() and ranks == str(int(ranks)) and int(ranks) >= 2:
        return int(ranks)
    return None


# Phases of a decode round, as traces record them and the simulator charges them. `finalize` is
# every standalone target append; `sync` host reads and cross-device waits; `other` the rest of a
# round's host wall time (token copies, bookkeeping, launch gaps).
PHASES = ("draft_body", "draft_head", "verify", "finalize", "sync", "other")
# The simulator also charges `initial`, the draft's prefill, which the decoder finishes within TTFT.
SIMULATED_PHASES = ("initial", *PHASES)

# Cost regimes of a profile, and the --graphs flag that picks one.
REGIMES = ("graphs", "eager")
REGIME_OF_GRAPHS_FLAG = {"on": "graphs", "off": "eager"}

# Events of a round, in the order the host issues them; the decoder and the simulator log the same
# sequence for the same run as (name, stream, tokens) tuples (docs/contracts.md, "Schedule event
# order"; tests/test_schedule_parity.py).
EVENTS = ("catch_up", "draft_step", "lookup", "copy_tokens", "sync", "verify", "append")
