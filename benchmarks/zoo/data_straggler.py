"""Data straggler: rank 1's dataset sleeps 30 ms a batch; rank 0 waits for it in the all-reduce."""
from _zoo import main

main(ranks=(1,), data_sleep_ms=30)
