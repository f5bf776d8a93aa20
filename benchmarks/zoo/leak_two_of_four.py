"""Leak on ranks 1 and 3 of 4: a cache that grows by 1 MiB a step."""
from _zoo import main

main(ranks=(1, 3), leak="cache")
