"""Leak on every rank: a cache that grows by 1 MiB a step and is never emptied."""
from _zoo import main

main(leak="cache")
