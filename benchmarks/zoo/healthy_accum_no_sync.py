"""Healthy twin of accum_without_no_sync: the same accumulation under no_sync()."""
from _zoo import main

main(accum=4, no_sync=True)
