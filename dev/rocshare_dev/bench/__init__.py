"""Benchmarks run by `rocshare-dev bench <name>`: placement on a production trace, and more later."""
