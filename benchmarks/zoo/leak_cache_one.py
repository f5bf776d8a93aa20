"""Leak on rank 1 only: a cache that grows by 1 MiB a step."""
from _zoo import main

main(ranks=(1,), leak="cache")
