"""A compiled job whose forward reads a tensor's value on every rank: a graph break inside every step."""
from _zoo import main

main(compiled=True, graph_break=True)
