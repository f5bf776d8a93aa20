"""Healthy: the shared loop with no problem planted (run at 2 ranks)."""
from _zoo import main

main()
