"""Benchmarks run with pytest-benchmark; see run.py for the table they make."""
