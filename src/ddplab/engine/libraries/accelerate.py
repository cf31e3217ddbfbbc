"""Hugging Face accelerate, as data: its files, what its frames do when a collective is reached
through them, its own exceptions. Frames were read from real stacks of accelerate 1.15 jobs under
torchrun (tests/scripts/clients/accelerate_train.py)."""
ID = "accelerate"
NAME = "accelerate"
PACKAGES = ("accelerate",)
FRAMES = {
    ("accelerator.py", "gather_for_metrics"): "accelerate's gather_for_metrics, an all_gather across processes",
    ("accelerator.py", "gather"): "accelerate's gather, an all_gather across processes",
    ("accelerator.py", "reduce"): "accelerate's reduce, an all_reduce across processes",
    ("accelerator.py", "pad_across_processes"): "accelerate's pad_across_processes, which gathers every process's size",
    ("accelerator.py", "wait_for_everyone"): "accelerate's wait_for_everyone(), a barrier",
    ("accelerator.py", "backward"): "accelerate's backward, where DDP averages the gradients",
    ("accelerator.py", "prepare"): "accelerate's prepare, which wraps the model in DistributedDataParallel",
    ("accelerator.py", "save_state"): "accelerate's save_state",
    ("accelerator.py", "load_state"): "accelerate's load_state",
    ("state.py", "wait_for_everyone"): "accelerate's wait_for_everyone(), a barrier",
    ("utils/operations.py", "broadcast_object_list"): "accelerate's broadcast_object_list",
}
# accelerate's own exceptions (none yet: each needs a message captured from a real run first)
EXCEPTIONS: dict = {}
