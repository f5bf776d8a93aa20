"""Healthy twin of dataloader_starved: cheap samples, two DataLoader workers."""
from _zoo import main

main(workers=2)
