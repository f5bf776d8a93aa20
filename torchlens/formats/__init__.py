"""Readers of the file formats torchlens takes in, each producing model objects.

A format package imports only ``torchlens.model`` (plus numpy, msgspec and the
standard library), so capture, analysis and the CLI can all read files without
importing each other. ``tests/test_layers.py`` holds that rule.
"""
