"""Leak on every rank: the losses summed without .item(), so every step's graph stays alive."""
from _zoo import main

main(leak="graph")
