"""Float16 with a GradScaler: rank 1's batch overflows every 10 steps, so the scaler skips those optimizer steps (on every rank: DDP shares the inf)."""
from _zoo import main

main(ranks=(1,), amp="fp16", overflow_every=10)
