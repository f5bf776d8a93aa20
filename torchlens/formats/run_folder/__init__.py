"""A run folder: the one writer and the one reader of its files.

``%ddp_check --profile`` and ``torchlens run`` each leave a run folder::

    RUN_DIR/manifest.json                     the typed, versioned Manifest (manifest.py)
    RUN_DIR/rank<r>/step<NNNNN>.pt.trace.json  each profiled step's Kineto trace
    RUN_DIR/rank<r>/steps.jsonl               every step record of the rank (records.py)
    RUN_DIR/rank<r>/summaries.jsonl           torchlens run: its profiled-step summaries
    RUN_DIR/rank<r>/oom.pickle                CUDA: the allocator snapshot on OOM
    RUN_DIR/live.jsonl, live.json             torchlens run: its live feed and status

``write``: ``write_run_folder``, the one writer both launchers call;
``files``: every name and path of that layout, and the careful open;
``manifest``: ``Manifest``, ``write_manifest``, ``read_manifest``;
``records``: each rank's ``steps.jsonl`` and ``summaries.jsonl``;
``sources``: ``discover``, a run's per-rank traces (a run folder, any folder
or a list of files) each placed at its rank, and everything wrong named.

Nothing is imported here. ``sources`` reads ``formats.kineto.peek``; the
peek never reads this package (the manifest's ``format`` it recognises is
``formats.file_kind.RUN_FORMAT``).
"""
