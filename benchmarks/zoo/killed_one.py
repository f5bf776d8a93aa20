"""Rank 1 is killed with SIGKILL at step 40, as the OOM killer ends a process:
no exception, no goodbye; rank 0 then fails in its all-reduce."""
from _zoo import main

main(ranks=(1,), kill_at=40)
