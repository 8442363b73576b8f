"""Benchmarks run by `rocshare bench <name>`: placement on a production trace, and more later."""
