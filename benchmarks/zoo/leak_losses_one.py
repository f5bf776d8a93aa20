"""Leak on rank 1 only: its loss and logits tensors kept in a list (8192 classes: 1 MiB of logits a step)."""
from _zoo import main

main(ranks=(1,), leak="losses", vocab=8192)
