"""A periodic stall on rank 1: 150 ms every 10th step."""
from _zoo import main

main(ranks=(1,), stall_every=10, stall_ms=150)
