"""Benchmarks of the settlement layer (``python -m bench.run``)."""
