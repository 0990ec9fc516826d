"""Benchmarks that print figures (``make bench``); they never assert timings."""
