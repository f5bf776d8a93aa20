"""Healthy: a Hugging Face Trainer job (tiny BERT from a config, random weights,
no downloads; CPU, gloo), 60 optimizer steps, no problem planted."""
import os
import tempfile

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

STEPS = int(os.environ.get("ZOO_STEPS", "100")) * 3 // 5


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": i % 2}


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=STEPS, per_device_train_batch_size=4,
            learning_rate=1e-3, report_to=[], use_cpu=True, ddp_backend="gloo",
            logging_strategy="no", save_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0)
        Trainer(model=BertForSequenceClassification(config), args=args,
                train_dataset=Rows()).train()

    # gloo's threads can abort a process that exits with its group alive
    # (pytorch/pytorch#190489): end it as torch's docs ask
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
