"""The simulator: a SimPy replay of the speculative loop from a cost profile (`contracts.profile`) and an
acceptance source (a recorded trace, `contracts.trace`, or a rate) -> predicted throughput, phase
shares, head-only ceilings and what-ifs (`python -m sim`).

It imports only `contracts`, the standard library, simpy and matplotlib, never torch: it runs anywhere
from files alone. API:
    rows, resolved = sim.simulate_scenario(sim.Scenario(acceptance="0.6", schedules=("deferred",), K=4))
    rows, resolved = sim.simulate_scenario(sim.with_change(scenario, "probes", "=", "2"))  # a what-if
"""

from sim.scenario import Scenario, with_change
from sim.scenario import run as simulate_scenario

__all__ = ["Scenario", "simulate_scenario", "with_change"]
