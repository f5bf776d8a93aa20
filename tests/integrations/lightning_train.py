"""A PyTorch Lightning job that never imports torchlens unless told to (CPU, gloo).

``strategy="ddp"`` on 2 CPU processes: under torchrun Lightning takes the
ranks torchrun started; run as ``python lightning_train.py`` Lightning starts
its own ranks. Rank ``TL_SLOW_RANK`` (default 1) sleeps ``TL_SLOW_S`` per
batch in its dataset. ``TL_STEPS`` optimizer steps (default 8) of
``TL_ACCUM`` batches (default 1); ``TL_VAL_EVERY`` > 0: a validation every
that many batches. ``TL_CALLBACK=1`` (default): the script adds
``torchlens.integrations.lightning.TorchlensCallback`` (``0``: under ``torchlens
run`` it is added by itself). ``TL_CKPT=1``: Lightning's default
``ModelCheckpoint`` saves after each validation. ``TL_PACKAGE=pytorch_lightning``:
the job is written against the older ``pytorch_lightning`` distribution (its
own classes, its own callbacks-factory group). ``TL_COMPILE=1``: the module's
network under ``torch.compile`` (backend ``aot_eager``); ``TL_BF16=1``:
``precision="bf16-mixed"``.
"""

import os
import sys
import time

import torch

if os.environ.get("TL_PACKAGE") == "pytorch_lightning":
    import pytorch_lightning as pl
else:
    import lightning.pytorch as pl

STEPS = int(os.environ.get("TL_STEPS", "8"))
ACCUM = int(os.environ.get("TL_ACCUM", "1"))
VAL_EVERY = int(os.environ.get("TL_VAL_EVERY", "0"))
SLOW_RANK = int(os.environ.get("TL_SLOW_RANK", "1"))
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.05"))


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        # the rank is read here, when the batch is loaded: Lightning's own
        # launcher sets no RANK before its ranks start
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == SLOW_RANK:
            time.sleep(SLOW_S / 8)  # 8 rows a batch
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.tensor(float(i % 2))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        if os.environ.get("TL_COMPILE") == "1":
            self.net = torch.compile(self.net, backend="aot_eager")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y),
                 sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    callbacks = []
    if os.environ.get("TL_CALLBACK", "1") == "1":
        from torchlens.integrations.lightning import TorchlensCallback

        callbacks.append(TorchlensCallback())
    loader = torch.utils.data.DataLoader(Rows(), batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(Rows(), range(32)), batch_size=8)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS,
        accumulate_grad_batches=ACCUM, callbacks=callbacks, logger=False,
        enable_checkpointing=os.environ.get("TL_CKPT") == "1", enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=4 if VAL_EVERY else 0,
        precision="bf16-mixed" if os.environ.get("TL_BF16") == "1" else "32-true",
        val_check_interval=VAL_EVERY or None, default_root_dir=sys.argv[1])
    trainer.fit(Model(), loader, val if VAL_EVERY else None)

    # gloo's threads can abort a process that exits with its group alive
    # (pytorch/pytorch#190489): end it as torch's docs ask
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
