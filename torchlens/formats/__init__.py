"""The shapes of data torchlens reads from outside, each turned into plain values.

``kineto``: torch.profiler trace files (JSON, plain or gzip) to a ``Trace``.
``fingerprints``: the per-collective record DDP workers exchange and save.
``run_folder``: the run folder of ``%ddp_check --profile`` and ``torchlens
run``, its one writer and reader (the typed manifest, each rank's records),
and a run's per-rank traces (folder or files) each placed at its rank,
every bad input named, without parsing the traces (``kineto.peek``).

A format module imports only ``torchlens.model`` and other formats (plus
numpy, msgspec and the standard library), so capture, analysis and the CLI
can all use it without importing each other; ``tests/test_layers.py`` holds that rule.
"""
