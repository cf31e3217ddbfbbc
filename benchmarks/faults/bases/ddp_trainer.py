"""Base program: a DDP trainer in the shape of pytorch/examples distributed/ddp-tutorial-series/
multigpu_torchrun.py (Trainer class, DistributedSampler, set_epoch, rank-0 snapshot), on CPU/gloo and
small enough to run in seconds. The `# @site:` comments mark where mutation operators apply (the
suite removes them from the mutants)."""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.size = size
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    init_process_group(backend="gloo")  # @site:init


def make_model():
    torch.manual_seed(0)  # @site:seed
    return nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))  # @site:model


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.model = DDP(model)  # @site:wrap

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)  # @site:forward
        loss = F.mse_loss(output, targets)
        loss.backward()  # @site:backward
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)  # @site:set_epoch
        for source, targets in self.train_data:  # @site:batches
            self._run_batch(source, targets)
        print(f"[rank{self.global_rank}] epoch {epoch} | steps {len(self.train_data)}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}  # @site:save
        torch.save(snapshot, self.snapshot_path)

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:  # @site:save_if
                self._save_snapshot(epoch)  # @site:save_call
        dist.barrier()  # @site:after_train


def evaluate(snapshot_path):
    """Every rank reloads the saved snapshot into a plain model and scores it."""
    model = make_model()
    snapshot = torch.load(snapshot_path)  # @site:load_file
    model.load_state_dict(snapshot["MODEL_STATE"])  # @site:load
    model.eval()
    x = torch.rand(16, 20, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(x).mean().item()


def prepare_dataloader(dataset, batch_size):
    sampler = DistributedSampler(dataset)  # @site:sampler
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler)


def main(save_every=1, total_epochs=2, batch_size=8):
    ddp_setup()  # @site:setup_call
    dataset = MyTrainDataset(64)  # @site:dataset
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train_data = prepare_dataloader(dataset, batch_size)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none") + os.environ["MASTER_PORT"]
    snapshot_path = os.path.join(tempfile.gettempdir(), f"faults_snapshot_{run_id}.pt")
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    score = evaluate(snapshot_path)
    print(f"[rank{trainer.global_rank}] score {score:.4f}", flush=True)
    dist.barrier()  # @site:before_cleanup
    if trainer.global_rank == 0:
        os.remove(snapshot_path)
    destroy_process_group()


if __name__ == "__main__":
    main()
