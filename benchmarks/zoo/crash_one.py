"""A crash on rank 1 at step 40; rank 0 then fails in its all-reduce."""
from _zoo import main

main(ranks=(1,), crash_at=40)
