"""The Hugging Face Trainer job of ``bench_hf_traceml.py`` (issue 23): no
profiler import, run by torchrun (2 gloo ranks on the CPU).

A tiny BERT built from a config (random weights, no hub access), batch 2 of 16
tokens, ``--steps`` optimizer steps. With ``--slow-ms`` > 0, rank
``--slow-rank``'s data collator sleeps that long for every batch (a data
straggler); ``--slow-ms 0`` is the even run.

The step time is the job's own: a plain ``TrainerCallback`` takes
``perf_counter`` at every ``on_step_end`` and writes ``OUT/rank<r>.json`` (the
intervals between consecutive step ends, i.e. data + forward + backward +
optimizer + whatever a tool adds inside the step). The callback is the same in
every variant, so no tool's own figure is used for timing.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

RANK = int(os.environ.get("RANK", "0"))


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}


class Collate:
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __call__(self, rows: list) -> dict:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"input_ids": torch.stack([r["input_ids"] for r in rows]),
                "labels": torch.tensor([r["labels"] for r in rows])}


class StepClock(TrainerCallback):
    """perf_counter at each optimizer step's end, written out at the train's end."""

    def __init__(self, out: Path, warmup: int) -> None:
        self.out, self.warmup, self.ends = out, warmup, []
        self.cpu_ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.ends.append(time.perf_counter())
        self.cpu_ends.append(time.process_time())

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        gaps = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)][self.warmup:]
        cpu = [b - a for a, b in zip(self.cpu_ends, self.cpu_ends[1:], strict=False)][self.warmup:]
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{RANK}.json").write_text(json.dumps({
            "steps": len(self.ends), "timed": len(gaps),
            "median_ms": 1e3 * statistics.median(gaps), "mean_ms": 1e3 * statistics.fmean(gaps),
            "max_ms": 1e3 * max(gaps), "cpu_median_ms": 1e3 * statistics.median(cpu)}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    a = p.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32)
    out = Path(a.out)
    args = TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=a.steps, per_device_train_batch_size=2,
        learning_rate=1e-3, report_to=[], use_cpu=True, ddp_backend="gloo",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        eval_strategy="no", save_strategy="no", remove_unused_columns=False)
    sleep_s = a.slow_ms / 1e3 if RANK == a.slow_rank else 0.0
    Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Rows(),
            data_collator=Collate(sleep_s), callbacks=[StepClock(out, a.warmup)]).train()
    # without it gloo's threads sometimes abort the exit ("terminate called
    # without an active exception"), failing a launch that trained fine
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
