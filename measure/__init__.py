"""Microbenchmarks on the real devices: every cost of the speculative loop (target verify T_p(n), draft
body and heads, appends, syncs, copies), written as a cost profile (`contracts.profile`) with a
Markdown summary (`python -m measure`); and the maintained GPU benchmarks `measure.speed`,
`measure.head_speed` and `measure.awq_sweep`.

API (needs torch; imported on first use):
    measure.measure_profile(measure.MeasureSettings(target=..., draft=..., placement=...), out, command)
"""

from contracts.cli import api_attribute

_API = {"MeasureSettings": "measure.profiling", "measure_profile": "measure.profiling"}


def __getattr__(name):
    return api_attribute(_API, __name__, name)
