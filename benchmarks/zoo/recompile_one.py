"""Rank 1 of a compiled job recompiles at steps 62 and 87: its batch changes size there and shapes are static."""
from _zoo import main

main(ranks=(1,), compiled=True, recompile_at=(62, 87))
