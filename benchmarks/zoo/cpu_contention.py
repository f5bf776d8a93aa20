"""CPU contention on rank 1: a busy process pinned to its core."""
from _zoo import main

main(ranks=(1,), cpu_hog=True)
