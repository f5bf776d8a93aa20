"""Leak on every rank: each step's loss tensor kept in a list (its graph and activations with it)."""
from _zoo import main

main(leak="losses")
