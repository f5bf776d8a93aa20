"""Leak on rank 1 only: its losses summed without .item()."""
from _zoo import main

main(ranks=(1,), leak="graph")
