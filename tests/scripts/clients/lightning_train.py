"""A PyTorch Lightning job as a user writes one (Trainer, strategy="ddp", CPU), tiny.

    torchrun --nproc-per-node 2 lightning_train.py --mode ok

Modes: ok; log (rank 0 alone calls ``self.log(..., sync_dist=True)``); barrier (rank 0 alone calls
``self.trainer.strategy.barrier()``); gpu (``accelerator="gpu"`` on a machine without one).
"""
import argparse
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.mode == "log" and self.global_rank == 0:
            self.log("train_loss", loss, sync_dist=True)
        if self.mode == "barrier" and batch_idx == 1 and self.trainer.is_global_zero:
            self.trainer.strategy.barrier()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(mode, *, steps=4):
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    trainer = L.Trainer(accelerator="gpu" if mode == "gpu" else "cpu", strategy="ddp",
                        devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Tiny(mode), data)
    print(f"rank {trainer.global_rank}: finished {trainer.global_step} steps")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ok", choices=["ok", "log", "barrier", "gpu"])
    main(p.parse_args().mode)
