"""Leak on rank 1 only: a metric of its logits summed without .item() (each step's graph and its 1 MiB softmax kept)."""
from _zoo import main

main(ranks=(1,), leak="graph", vocab=8192)
