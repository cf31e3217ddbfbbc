"""PyTorch Lightning (``lightning``, ``pytorch_lightning``, ``lightning_fabric``), as data: its
files, what its frames do when a collective is reached through them, its own exceptions.
Frames were read from real stacks of Lightning 2.6 jobs (tests/scripts/clients/lightning_train.py)."""
ID = "lightning"
NAME = "Lightning"
PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
# (file inside the package, function) -> what it does; the first that the user's call leads into,
# or the innermost one, is shown
FRAMES = {
    ("core/module.py", "log"): "Lightning's logging of self.log(..., sync_dist=True), which reduces the value across ranks",
    ("core/module.py", "log_dict"): "Lightning's logging of self.log_dict(..., sync_dist=True), which reduces the values across ranks",
    ("core/module.py", "all_gather"): "Lightning's self.all_gather",
    ("logger_connector/result.py", "compute"): "Lightning's epoch-end reduction of values logged with sync_dist=True",
    ("strategies/ddp.py", "barrier"): "Lightning's strategy.barrier()",
    ("strategies/ddp.py", "broadcast"): "Lightning's strategy.broadcast() from rank 0",
    ("strategies/ddp.py", "reduce"): "Lightning's strategy.reduce()",
    ("strategies/strategy.py", "barrier"): "Lightning's strategy.barrier()",
    ("strategies/ddp.py", "configure_ddp"): "Lightning wrapping the model in DistributedDataParallel",
    ("strategies/ddp.py", "setup_environment"): "Lightning's set-up of the process group",
    ("core/module.py", "backward"): "Lightning's backward of the loss training_step returned, where DDP averages the gradients",
    ("core/module.py", "manual_backward"): "Lightning's self.manual_backward, where DDP averages the gradients",
    ("trainer/connectors/data_connector.py", "_check_dataloader_iterable"): "Lightning's data set-up",
    ("fabric/fabric.py", "barrier"): "Fabric's barrier()",
    ("fabric/fabric.py", "all_reduce"): "Fabric's all_reduce()",
    ("fabric/fabric.py", "all_gather"): "Fabric's all_gather()",
    ("fabric/fabric.py", "broadcast"): "Fabric's broadcast()",
    ("fabric/fabric.py", "backward"): "Fabric's backward, where DDP averages the gradients",
}
# Lightning's own exceptions, raised from its own files: (what it means, the fix). The cause is shown in
# Lightning's terms: its message names what it refused.
EXCEPTIONS = {
    "MisconfigurationException": (
        "Lightning refused the Trainer's (or the module's) configuration",
        "Change the argument its message names (a GPU accelerator on a machine without one: "
        "Trainer(accelerator='auto') or 'cpu'; devices= no more than the machine has)."),
}
# where users reported it
SOURCES = ("https://github.com/Lightning-AI/pytorch-lightning/issues/20626",
           "https://github.com/microsoft/mattergen/issues/217",
           "https://github.com/sdatkinson/neural-amp-modeler/issues/94")
