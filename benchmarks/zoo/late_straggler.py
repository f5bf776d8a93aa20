"""A straggler from mid-run: from step STEPS // 2 on, rank 1's dataset sleeps
30 ms a batch (a node that starts throttling its storage); rank 0 waits for it."""
from _zoo import STEPS, main

main(ranks=(1,), data_sleep_ms=30, slow_from=STEPS // 2)
