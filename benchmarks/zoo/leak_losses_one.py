"""Leak on rank 1 only: its loss tensors kept in a list."""
from _zoo import main

main(ranks=(1,), leak="losses")
