"""Compute straggler: rank 1 runs a batch 32 times larger (its sampler's
shard holds the others' leftovers): about 10 ms more forward and backward a
step on this MLP, one thread a rank."""
from _zoo import main

main(ranks=(1,), batch_factor=32)
