"""CPU contention on rank 1: the ranks pinned to a core each, and a busy
process pinned to rank 1's."""
from _zoo import main

main(ranks=(1,), cpu_hog=True)
