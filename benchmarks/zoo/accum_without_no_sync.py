"""Gradient accumulation (4 micro-batches) that all-reduces every micro-batch: no no_sync()."""
from _zoo import main

main(accum=4, no_sync=False)
