"""Data straggler at 4 ranks: rank 2's dataset sleeps 30 ms a batch; the others wait for it in the all-reduce."""
from _zoo import main

main(ranks=(2,), data_sleep_ms=30)
