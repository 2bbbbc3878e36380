"""The vocabulary of the speculative loop: every part spells these names from here."""

# The five schedules, in the order tables list them; `docs/design.md` defines each in words.
SCHEDULES = ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred")
SPECULATIVE_SCHEDULES = SCHEDULES[1:]

# Draft LM heads a cost profile prices (sim, validate, measure); every kind the decoder runs, with
# its budgets, is a head spec of contracts/heads.py.
HEADS = ("dense", "flashhead")

# Where the two models run: target on cuda:0 and draft on cuda:1, both on cuda:0, or the CPU.
PLACEMENTS = ("two-gpu", "one-gpu", "cpu")

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
EVENTS = ("draft_step", "copy_tokens", "sync", "verify", "append")
