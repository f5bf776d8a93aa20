"""Garbage-collection pauses on rank 1: 1.5 M live objects and cyclic garbage every step."""
from _zoo import main

main(ranks=(1,), gc_churn=True)
