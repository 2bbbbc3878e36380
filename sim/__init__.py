"""SimPy replay of the speculative-decoding loop from a cost profile and an acceptance source.

Imports nothing from `model`, `measure` or `validate`, and never torch: it runs anywhere from files.
"""
