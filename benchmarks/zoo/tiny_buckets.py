"""DDP buckets far too small (bucket_cap_mb=0.001): an all-reduce per parameter each step."""
from _zoo import main

main(bucket_mb=0.001)
