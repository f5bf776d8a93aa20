"""Parameters drifting: rank 1 changes its head's weights outside DDP every step."""
from _zoo import main

main(ranks=(1,), drift=True)
