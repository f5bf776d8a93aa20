"""Launchers whose ranks ``torchlens run`` cannot attach, told before they start.

``accelerate launch --cpu`` does not use torchrun: its simple launcher starts
one process, or mpirun with ``--mpirun_hostfile`` (``accelerate.commands.
launch.launch_command``: ``--cpu`` skips ``multi_gpu_launcher``). mpirun's
ranks carry no ``RANK``, so none attaches when it starts.
"""

from __future__ import annotations

import os


def _value(words: list[str], *names: str) -> str | None:
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def accelerate_cpu(command: list[str]) -> str | None:
    """Why ``command``'s ranks will not attach, one line, when it is
    ``accelerate launch --cpu`` with several processes (given on the command
    line), else None; said before the job starts and in the verdict at its end."""
    if not command or os.path.basename(command[0]) != "accelerate" or command[1:2] != ["launch"]:
        return None
    flags = []
    for word in command[2:]:
        if word.endswith(".py"):
            break  # the training script: what follows is its own arguments
        flags.append(word)
    n = _value(flags, "--num_processes", "--num-processes")
    if "--cpu" not in flags or n is None or not n.isdigit() or int(n) < 2:
        return None
    return (f"accelerate launch --cpu starts its {n} processes without torchrun "
            "(mpirun with --mpirun_hostfile, else one process): they will not attach; run "
            f"torchrun --nproc-per-node {n} SCRIPT, or accelerate launch --multi_gpu "
            f"--num_processes {n} with Accelerator(cpu=True) in the script (gloo on the CPU)")
