"""Rank 0 evaluates every 10 steps; rank 1 waits for it in the next all-reduce."""
from _zoo import main

main(every=10, rank0_work="evaluate")
