"""Not a leak: a 48 MiB warm-up cache filled once a third of the way in, then kept."""
from _zoo import main

main(step_up="cache")
