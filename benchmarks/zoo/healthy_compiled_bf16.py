"""A compiled job under bfloat16 autocast, nothing planted."""
from _zoo import main

main(compiled=True, amp="bf16")
