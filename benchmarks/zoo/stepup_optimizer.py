"""Not a leak: a large layer unfrozen a third of the way in; its Adam state appears once."""
from _zoo import main

main(step_up="optimizer")
