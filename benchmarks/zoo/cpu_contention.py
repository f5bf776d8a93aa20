"""CPU contention on rank 1: the ranks pinned to a core each, and a busy
process pinned to rank 1's. Every rank's batch is 16x the others jobs': a
step that keeps its core busy (a rank that mostly waits in its all-reduce
gets its core back from the busy process whenever it wakes, and is not
slowed)."""
from _zoo import main

main(ranks=(1,), cpu_hog=True, work_factor=64)
