"""torch's own wrappers above its collectives (DDP, FSDP, distributed checkpoint, Join), as data:
what their frames do when a rank waits in a collective they issued. Calls straight into
``torch.distributed`` (``dist.all_reduce``) are named by the op itself, and DDP's own collectives by
``ddplab.engine.stacks.DDP_CALLS`` (the ``via``): neither has an entry here."""
ID = "torch"
NAME = "torch"
PACKAGES = ("torch",)
FRAMES = {
    ("distributed/fsdp/_fully_shard/_fsdp_state.py", "_pre_forward"): "FSDP's forward, which all-gathers the parameters",
    ("distributed/fsdp/fully_sharded_data_parallel.py", "forward"): "FSDP's forward, which all-gathers the parameters",
    ("distributed/checkpoint/state_dict_saver.py", "save"): "torch.distributed.checkpoint.save, a collective every rank must call",
    ("distributed/checkpoint/state_dict_loader.py", "load"): "torch.distributed.checkpoint.load, a collective every rank must call",
    ("distributed/algorithms/join.py", "__exit__"): "Join's context manager, which shadows the collectives of ranks that finished",
}
# the frames of torch itself that a user calls for a collective: the op names those
SKIP = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py", "torch/autograd/",
        "torch/_tensor.py", "torch/nn/modules/", "torch/optim/", "torch/utils/")
