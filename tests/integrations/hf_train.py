"""A Hugging Face Trainer job that never imports torchlens (CPU, gloo): a tiny
BERT built from a config (random weights, no hub access).

Rank ``TL_SLOW_RANK`` (default 1) sleeps ``TL_SLOW_S`` in its data collator.
``TL_STEPS`` optimizer steps (default 8), ``TL_ACCUM`` micro-batches each
(default 1); ``TL_EVAL_EVERY`` > 0: an evaluation (and a checkpoint) every
that many steps, ``TL_SAVE=0``: without the checkpoints; ``TL_EVAL_SLOW=1``:
the slow rank sleeps for its evaluation batches only. ``TL_CALLBACK=1``: the script adds ``TorchlensCallback``
itself as well (imported then), which must not count twice. ``TL_COMPILE=1``:
``torch_compile=True`` (backend ``aot_eager``: dynamo as under inductor, without
its code generation); ``TL_BF16=1``: ``bf16=True``.
"""

import os
import sys
import time

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

STEPS = int(os.environ.get("TL_STEPS", "8"))
ACCUM = int(os.environ.get("TL_ACCUM", "1"))
EVAL_EVERY = int(os.environ.get("TL_EVAL_EVERY", "0"))
SLOW_RANK = int(os.environ.get("TL_SLOW_RANK", "1"))
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.05"))
SAVE = os.environ.get("TL_SAVE", "1") == "1"
EVAL_SLOW = os.environ.get("TL_EVAL_SLOW") == "1"
RANK = int(os.environ.get("RANK", "0"))


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2,
                "eval": False}


class EvalRows(Rows):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        return {**super().__getitem__(i), "eval": True}


def collate(rows: list) -> dict:
    if RANK == SLOW_RANK and rows[0]["eval"] == EVAL_SLOW:
        time.sleep(SLOW_S)
    return {"input_ids": torch.stack([r["input_ids"] for r in rows]),
            "labels": torch.tensor([r["labels"] for r in rows])}


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32)
    model = BertForSequenceClassification(config)
    evaluate = EVAL_EVERY > 0
    args = TrainingArguments(
        output_dir=sys.argv[1], max_steps=STEPS, per_device_train_batch_size=2,
        per_device_eval_batch_size=2, gradient_accumulation_steps=ACCUM,
        learning_rate=1e-3, report_to=[], use_cpu=True, ddp_backend="gloo",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        eval_strategy="steps" if evaluate else "no", eval_steps=EVAL_EVERY or None,
        save_strategy="steps" if evaluate and SAVE else "no", save_steps=EVAL_EVERY or None,
        save_only_model=True, remove_unused_columns=False,
        torch_compile=os.environ.get("TL_COMPILE") == "1", torch_compile_backend="aot_eager",
        bf16=os.environ.get("TL_BF16") == "1")
    callbacks = []
    if os.environ.get("TL_CALLBACK") == "1":
        from torchlens.integrations.huggingface import TorchlensCallback

        callbacks.append(TorchlensCallback())
    eval_rows = EvalRows() if evaluate else None
    Trainer(model=model, args=args, train_dataset=Rows(), eval_dataset=eval_rows,
            data_collator=collate, callbacks=callbacks).train()

    # gloo's threads can abort a process that exits with its group alive
    # (pytorch/pytorch#190489): end it as torch's docs ask
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
