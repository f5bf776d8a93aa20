"""Healthy: a Lightning job (strategy="ddp" on CPU, the ranks torchrun started)
training the zoo's network, 60 optimizer steps, no problem planted."""
import os
import tempfile

import lightning.pytorch as pl
import torch
from _zoo import STEPS, Batches, Net


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    steps = STEPS * 3 // 5
    loader = torch.utils.data.DataLoader(Batches(steps, 32, 0, 0), batch_size=None)
    with tempfile.TemporaryDirectory() as out:
        trainer = pl.Trainer(
            accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
            strategy="ddp", max_steps=steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=out)
        trainer.fit(Model(), loader)

    # gloo's threads can abort a process that exits with its group alive
    # (pytorch/pytorch#190489): end it as torch's docs ask
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
