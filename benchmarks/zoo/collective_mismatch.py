"""Collective mismatch: halfway, rank 1 all-reduces 3 values while rank 0 all-reduces 5."""
from _zoo import main

main(ranks=(1,), mismatch=True)
