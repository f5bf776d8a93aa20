"""Healthy: the shared loop with no problem planted (run at 4 ranks)."""
from _zoo import main

main()
