"""Callbacks for the training frameworks that write the loop for their users.

Each module here imports its framework at its top, and nothing in torchlens
imports these modules unless the job uses the framework (``autoload`` waits
for the framework's own import), so ``import torchlens`` never imports one.
"""
