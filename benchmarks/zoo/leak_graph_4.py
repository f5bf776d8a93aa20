"""Leak on every rank of 4: a metric of the logits summed without .item(), so every step's graph (and the 1 MiB softmax it saved) stays alive."""
from _zoo import main

main(leak="graph", vocab=8192)
