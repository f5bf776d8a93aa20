"""Compute straggler: rank 1 runs a batch 8 times larger."""
from _zoo import main

main(ranks=(1,), batch_factor=8)
