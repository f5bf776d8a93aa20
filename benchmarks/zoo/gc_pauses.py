"""Garbage-collection pauses on rank 1: 1.5 M live objects and 50,000 new ones a step that live four steps."""
from _zoo import main

main(ranks=(1,), gc_churn=True)
