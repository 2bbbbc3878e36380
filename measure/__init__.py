"""Microbenchmarks of every cost in the speculative loop, written as a cost profile (docs/contracts.md)."""
