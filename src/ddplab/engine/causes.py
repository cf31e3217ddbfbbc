"""Known user mistakes: what an error means, in the learner's terms, and the fix.

Each ``Cause`` is recognised by what the error means, not by one message's wording: the exception
types it can be raised as (torch moved several from RuntimeError or AssertionError to ValueError
between versions) and key phrases, each a set of alternatives, that must all occur in the message
(the lines after the exception line included). A cause with no types is recognised by its phrases
alone (argparse's own ``error:`` line, which comes with no traceback). Every entry is tested
against a message captured from a real run of the mistake (``tests/data/real_<case>.txt``, made by
``tests/data/capture_causes.py``), and ``sources`` says where learners reported it.

The entries have a ``Signature``'s shape (id, title, patterns, explanation, lab, search) and come
first in ``signatures.CATALOG``, so a run's signature, excerpt and explanation work unchanged.
``lab`` is empty unless a lab teaches the failure. This module is data and pure lookups only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ddplab.engine.reasons import line_calls, raised_in

# An exception line as Python, torchrun ("[rank0]: ...") and ddplab's records print it.
_TYPE_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?(?P<type>\w*(?:Error|Exception)|SystemExit): ", re.M)
_WINDOW = 4000   # characters after the exception line in which its phrases must occur


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    types: tuple[str, ...]        # exception type names it is raised as (any version); () = phrases alone
    phrases: tuple[str, ...]      # regexes (case-insensitive), every one must occur
    explanation: str              # two lines: the cause in the learner's terms, then the fix
    lab: str = ""                 # the lab that teaches it, if one does
    sources: tuple[str, ...] = ()  # where learners reported it
    # what the evidence must hold for this reading (a predicate over reasons.FailureFacts, None when
    # only text is at hand); the entry is not named where it does not hold
    premise: Callable | None = None
    # what, in the same facts, shows the reading wrong even where the premise holds (None: nothing)
    rules_out: Callable | None = None

    @property
    def patterns(self) -> tuple[str, ...]:
        return self.phrases

    def _has_phrases(self, text: str) -> bool:
        return all(re.search(p, text, re.I) for p in self.phrases)

    def search(self, text: str) -> re.Match | None:
        """The exception line (or, with no types, the first phrase) the cause is recognised by."""
        if not self.types:
            return re.search(self.phrases[0], text, re.I | re.M) if self._has_phrases(text) else None
        for m in _TYPE_LINE.finditer(text):
            if m.group("type") in self.types and self._has_phrases(text[m.start():m.start() + _WINDOW]):
                return m
        return None

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "types": list(self.types), "patterns": list(self.phrases),
                "explanation": self.explanation, "lab": self.lab, "sources": list(self.sources),
                "premise": self.premise is not None}


# DDP's reducer: a step began before the previous one's gradients were all reduced (unused-parameters
# in ddplab.engine.signatures is the reading for parameters that never took part).
UNUSED_PATTERNS = (r"Expected to have finished reduction in the prior iteration before starting a new one",
                   r"did not receive grad for rank")

CAUSES: tuple[Cause, ...] = (
    Cause(
        "cuda-on-cpu-torch", "A CUDA call on a torch without CUDA",
        ("AttributeError", "AssertionError", "RuntimeError"),
        (r"_cuda_setDevice|Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available",),
        "The script uses the GPU (torch.cuda.set_device, .cuda(), device='cuda'), and this torch has no CUDA (a CPU build, or no GPU here).\n"
        "On CPU: init_process_group('gloo'), don't call set_device or .cuda(), keep tensors on 'cpu', DDP(model, device_ids=None); "
        "or pick the device with torch.cuda.is_available().",
        sources=("https://github.com/hpzhao/SummaRuNNer/issues/32", "https://github.com/karpathy/nanoGPT/issues/281",
                 "https://github.com/facebookresearch/detectron2/issues/460")),
    Cause(
        "accelerator-index-on-cpu", "A device index (.to(rank), device=rank) on a machine with no accelerator",
        ("RuntimeError",),
        (r"Cannot access accelerator device when none is available",),
        "An integer device (model.to(gpu_id), torch.zeros(n, device=local_rank), set_device_index(rank)) means "
        "'accelerator number N', and this machine has none (a CPU torch, or no GPU).\n"
        "Make the device once and pass it: device = torch.device(f'cuda:{local_rank}') if torch.cuda.is_available() "
        "else torch.device('cpu'); then model.to(device), tensor.to(device).",
        sources=("https://github.com/pytorch/examples/tree/main/distributed/ddp-tutorial-series",)),
    Cause(
        "no-accelerator-none", "torch.accelerator.current_accelerator() is None here",
        ("AttributeError", "TypeError"),
        (r"NoneType",),
        "torch.accelerator.current_accelerator() returns None on a machine with no accelerator (a CPU torch, or no GPU), "
        "and the script used it as a device (.type, a device string).\n"
        "Check first: acc = torch.accelerator.current_accelerator(); device = torch.device(acc.type, local_rank) if acc "
        "else torch.device('cpu'); the backend for it: dist.get_default_backend_for_device(device) (gloo on CPU).",
        sources=("https://github.com/pytorch/examples/tree/main/distributed",),
        premise=line_calls("current_accelerator")),
    Cause(
        "no-gpu-device-count-zero", "Dividing by torch.cuda.device_count(), which is 0 here",
        ("ZeroDivisionError",),
        (r"modulo by zero|division by zero",),
        "torch.cuda.device_count() is 0 on a machine without a GPU (or a CPU torch), and the script divides by it "
        "(rank % torch.cuda.device_count() to pick a GPU).\n"
        "Pick a GPU only when there is one: device = torch.device('cuda', local_rank) if torch.cuda.is_available() "
        "else torch.device('cpu') (torchrun gives LOCAL_RANK: no modulo needed).",
        sources=("https://github.com/pytorch/examples/tree/main/distributed",),
        premise=line_calls("device_count")),
    Cause(
        "ddp-device-ids-cpu", "DDP given device_ids for a model on the CPU",
        ("ValueError", "AssertionError", "RuntimeError"),
        (r"device_ids", r"only work with|can only be None or contain a single element|single-device"),
        "DistributedDataParallel(model, device_ids=[rank]) names GPUs, but the model's parameters are on the CPU "
        "(or on several devices).\nOn CPU pass device_ids=None (leave it out); on GPUs move the model first: "
        "model.to(local_rank), then DDP(model, device_ids=[local_rank]).",
        sources=("https://github.com/pytorch/pytorch/issues/100243", "https://github.com/pytorch/pytorch/issues/46821",
                 "https://github.com/ultralytics/ultralytics/pull/15701")),
    Cause(
        "gloo-ifname-exclusion", "GLOO_SOCKET_IFNAME holds NCCL's exclusion syntax (^lo)",
        ("RuntimeError",),
        (r"Unable to find address for: *\^",),
        "GLOO_SOCKET_IFNAME='^lo' is NCCL's way to say 'any interface but lo'; gloo takes one interface name (or a comma list of names) "
        "and looks for an interface called '^lo'.\nSet GLOO_SOCKET_IFNAME to the interface itself (eth0, ens5: `ip -4 route get "
        "MASTER_ADDR` names it), and keep the ^ form for NCCL_SOCKET_IFNAME only.",
        lab="",
        sources=("https://github.com/aws-samples/aws-do-eks/pull/51",)),
    Cause(
        "launch-local-rank-arg", "A script written for torch.distributed.launch (--local_rank)",
        (),
        (r"error: (the following arguments are required|unrecognized arguments):.*--local[_-]rank",),
        "The script's argparse expects --local_rank, which the old launcher (python -m torch.distributed.launch) passed; "
        "torchrun passes LOCAL_RANK in the environment instead.\nRead it there: local_rank = int(os.environ['LOCAL_RANK']) "
        "(and drop the argument, or give it default=int(os.environ.get('LOCAL_RANK', 0))).",
        sources=("https://github.com/wz0919/ScaleVLN/issues/13", "https://github.com/hkchengrex/XMem/issues/18",
                 "https://github.com/XPixelGroup/BasicSR/issues/626")),
    Cause(
        "process-group-not-initialized", "A torch.distributed call before init_process_group",
        ("ValueError", "RuntimeError", "AssertionError"),
        (r"Default process group has not been initialized",),
        "Something called torch.distributed (get_rank, a collective, DistributedSampler, SyncBatchNorm, DDP) before "
        "init_process_group, or after destroy_process_group, or in a run started without torchrun.\n"
        "Call dist.init_process_group(...) first, in every rank, and start the script with torchrun.",
        # raised in the rank's own process (not re-raised from a DataLoader worker: process-group-in-worker), and
        # not where the rank's own records show init_process_group called in it and not destroyed since
        premise=lambda f: f.own_process and not f.initialised,
        sources=("https://github.com/megvii-model/YOLOF/issues/11", "https://github.com/open-mmlab/mmsegmentation/issues/901",
                 "https://github.com/lufficc/SSD/issues/196")),
    Cause(
        "dataloader-timeout", "A DataLoader timeout shorter than a worker takes for one batch",
        ("RuntimeError",),
        (r"DataLoader timed out after \d+ seconds",),
        "The DataLoader was given timeout=N (seconds) and its worker took longer than that to make one batch "
        "(slow storage, heavy decoding, a worker that stalls), so the rank stopped waiting and raised.\n"
        "Leave timeout out (0: wait as long as the batch takes) or set it above the slowest batch; make batches "
        "faster with more num_workers or cheaper loading.",
        # the rank's own wait for its workers (not an exception re-raised from one)
        premise=lambda f: f.own_process,
        sources=("https://github.com/MPI-Dortmund/tomotwin-cryoet/pull/57",)),
    Cause(
        "dataloader-worker-killed", "A DataLoader worker process was killed (the OOM killer, a signal)",
        ("RuntimeError",),
        (r"DataLoader worker \(pid.*?\) (?:is killed by signal|exited unexpectedly)",),
        "A worker process the rank's DataLoader started ended on a signal (SIGKILL: most often the kernel's OOM "
        "killer when memory ran out while it loaded a record), and the rank, still alive, raised when it found it gone.\n"
        "Look in the kernel log (dmesg: 'Killed process <pid>'); lower what each worker holds (fewer num_workers, a "
        "smaller prefetch_factor, no large object copied into every worker, the record that needs the memory), or "
        "raise the limit.",
        # the rank's own error about its worker: the rank itself was not killed
        premise=lambda f: f.own_process,
        sources=("https://github.com/pytorch/pytorch/issues/8976", "https://github.com/CompVis/latent-diffusion/issues/76")),
    Cause(
        "weights-only-load", "torch.load refused a checkpoint that holds more than tensors (weights_only=True)",
        ("UnpicklingError",),
        (r"Weights only load failed",),
        "Since torch 2.6 torch.load(path) loads with weights_only=True: tensors, state dicts and plain types only; "
        "this checkpoint holds another object (an argparse.Namespace, a class of the script), named in the message.\n"
        "Save only state dicts and plain values (vars(args), not args); for a file you trust, torch.load(path, "
        "weights_only=False), or allow the class with torch.serialization.add_safe_globals([TheClass]).",
        premise=raised_in("load", "torch/serialization.py"),
        sources=("https://github.com/facebookresearch/seamless_communication/issues/159",
                 "https://github.com/mlcommons/mlperf-automations/issues/465")),
    Cause(
        "makedirs-race", "os.makedirs of a folder that already exists (every rank makes it, or an earlier run did)",
        ("FileExistsError",),
        (r"File exists",),
        "os.makedirs(path) raises when the folder exists: every rank makes the same folder and only the first "
        "succeeds (the others find it made), or an earlier run left it.\n"
        "Use os.makedirs(path, exist_ok=True) on every rank, or make it on one rank and dist.barrier() before "
        "the others use it.",
        premise=raised_in("makedirs", "os.py", "<frozen os>"),
        sources=("https://github.com/huawei-bayerlab/marigold-v2/pull/7", "https://github.com/allenai/allennlp/issues/3841")),
    Cause(
        "collective-non-tensor-arg", "A collective given a Python value, not a tensor",
        ("TypeError", "RuntimeError"),
        (r"Invalid function argument\. Expected parameter `\w+` of type torch\.Tensor",),
        "torch.distributed's collectives work in place on tensors, and this one was given something else (a Python "
        "float from .item(), a list, a NumPy value), named in the message.\n"
        "Pass a tensor and read it back: t = torch.tensor([value]); dist.all_reduce(t); value = t.item(); for "
        "Python objects use all_gather_object or broadcast_object_list.",
        # torch.distributed's own argument check refused it (not a tensor of the wrong kind elsewhere)
        premise=raised_in("_check_single_tensor", "torch/distributed/distributed_c10d.py"),
        sources=("https://github.com/SCHENLIU/longformer-chinese/issues/15",)),
    Cause(
        "inplace-on-leaf", "A parameter changed in place where autograd records it",
        ("RuntimeError",),
        (r"a leaf Variable that requires grad is being used in an in-place operation",),
        "A parameter (a leaf tensor with requires_grad=True) was changed in place (p /= n, p.add_(...), an "
        "all_reduce into it) outside torch.no_grad(), and autograd refuses an in-place change of a leaf it tracks.\n"
        "Change parameters under torch.no_grad() (with torch.no_grad(): dist.all_reduce(p); p /= world_size), as "
        "optimizers do; to keep replicas equal, let DDP average the gradients instead of the weights.",
        premise=lambda f: f.own_process,
        sources=("https://github.com/JuliaWolleb/diffusion-anomaly/issues/9", "https://github.com/pytorch/examples/pull/779")),
    Cause(
        "process-group-initialized-twice", "init_process_group called twice",
        ("ValueError", "RuntimeError"),
        (r"initialize the default process group twice",),
        "init_process_group ran a second time in the same process: the script and a helper (a framework, a utility) both initialise.\n"
        "Initialise once: `if not dist.is_initialized(): dist.init_process_group(...)`.",
        sources=("https://github.com/NVIDIA/Megatron-LM/pull/521", "https://github.com/intel/torch-xpu-ops/issues/1525")),
    Cause(
        "fd-limit", "A process ran out of file descriptors (its open-files limit, ulimit -n)",
        ("DistNetworkError", "DistStoreError", "RuntimeError", "OSError"),
        (r"EMFILE|too many open files|errno:? ?24\b",),
        "A process hit its soft limit on open files (ulimit -n): every socket is a file descriptor, and the master's "
        "store holds one per rank that connects, gloo one per peer, so a low limit stops init_process_group.\n"
        "Raise the limit where the job starts (ulimit -n 65536, or resource.setrlimit(RLIMIT_NOFILE, (hard, hard)) "
        "before init_process_group); check it on every node with `ulimit -n` or /proc/<pid>/limits.",
        lab="06", sources=("https://github.com/pytorch/pytorch/issues/11201",
                           "https://github.com/pytorch/tensorpipe/issues/460")),
    Cause(
        "rank-outside-world", "A process asked for a rank outside 0..world_size-1",
        ("RuntimeError", "ValueError"),
        (r"rank < size\. \d+ vs \d+",),
        "init_process_group was given a rank that is not in 0..world_size-1 (ranks counted from 1, or a RANK from "
        "another numbering), and gloo refused it.\n"
        "Under torchrun leave rank and world_size out of init_process_group (it reads RANK and WORLD_SIZE); if you pass "
        "them, take rank=int(os.environ['RANK']), counted from 0.",
        lab="06", sources=("https://github.com/pytorch/pytorch/pull/49131",)),
    Cause(
        "nccl-without-gpu", "NCCL asked for on a torch or machine without it",
        ("RuntimeError", "ValueError", "AssertionError"),
        (r"doesn't have NCCL built in|ProcessGroupNCCL is only supported with GPUs|NCCL is not available",),
        "init_process_group('nccl') needs a CUDA build of torch and a GPU per rank; this torch has no NCCL (a CPU build, macOS or Windows).\n"
        "Use backend 'gloo' on CPU (or pick it: 'nccl' if torch.cuda.is_available() else 'gloo').",
        lab="06", sources=("https://github.com/bshall/hubert/issues/1", "https://github.com/pytorch/pytorch/issues/159742",
                 "https://github.com/modelscope/modelscope/issues/334")),
    Cause(
        "no-backend-for-device", "A tensor on a device the process group has no backend for",
        ("RuntimeError",),
        (r"No backend type associated with device type",),
        "The process group was made for one device (NCCL: CUDA tensors) and a collective got a tensor on another (a CPU tensor, "
        "often from .item() or a metric kept on the CPU).\nMove the tensor to the group's device first, or init with both: "
        "init_process_group('cpu:gloo,cuda:nccl').",
        lab="", sources=("https://github.com/THUDM/SwissArmyTransformer/issues/173",
                 "https://github.com/Lightning-AI/pytorch-lightning/issues/18803")),
    Cause(
        "syncbn-on-cpu", "SyncBatchNorm on the CPU",
        ("ValueError", "RuntimeError"),
        (r"SyncBatchNorm (layers only work with GPU modules|expected input tensor to be on GPU)",),
        "SyncBatchNorm synchronises batch statistics across GPUs; it does not run on CPU tensors.\n"
        "On CPU keep BatchNorm (skip nn.SyncBatchNorm.convert_sync_batchnorm), or move the model to GPUs.",
        sources=("https://github.com/QData/spacetimeformer/issues/90", "https://github.com/open-mmlab/mmagic/issues/133")),
    Cause(
        "ddp-parameter-ready-twice", "A parameter's gradient arrived twice in one backward (checkpoint or shared weights)",
        ("RuntimeError",),
        (r"mark a variable ready only once|marked as ready twice",),
        "DDP counts one gradient per parameter per backward; reentrant checkpointing of the same layer (or a weight shared "
        "across concurrent forwards) gave one twice.\nUse torch.utils.checkpoint(..., use_reentrant=False), or DDP(..., static_graph=True) "
        "when the graph is the same every step.",
        sources=("https://github.com/microsoft/FocalNet/issues/4", "https://github.com/Lightning-AI/pytorch-lightning/issues/4033")),
    Cause(
        "ddp-no-trainable-parameters", "DDP around a model with nothing to train",
        ("RuntimeError", "AssertionError"),
        (r"DistributedDataParallel is not needed when a module doesn't have any parameter that requires a gradient",),
        "Every parameter of the module given to DDP has requires_grad=False (a frozen feature extractor, a loss network), "
        "so there are no gradients to average.\nDon't wrap it: move it to the device and call it as it is; wrap only the trained part.",
        sources=("https://github.com/pytorch/pytorch/issues/45326", "https://github.com/huggingface/accelerate/issues/760")),
    Cause(
        "ddp-wrapper-attribute", "An attribute of the model asked of the DDP wrapper",
        ("AttributeError",),
        (r"'DistributedDataParallel' object has no attribute",),
        "DDP wraps the model: its own methods and attributes (predict, generate, a layer) live on ddp_model.module, not on the wrapper.\n"
        "Call ddp_model.module.<name> (forward still goes through ddp_model(x), so that gradients are averaged).",
        sources=("https://github.com/ultralytics/yolov5/issues/90", "https://github.com/VinAIResearch/XPhoneBERT/issues/7",
                 "https://github.com/huggingface/diffusers/issues/2044")),
    Cause(
        "state-dict-module-prefix", "A checkpoint saved from the DDP wrapper (keys start with 'module.')",
        ("RuntimeError",),
        (r"Error\(s\) in loading state_dict", r"Unexpected key\(s\) in state_dict: \"module\."),
        "The checkpoint was saved from the DDP (or DataParallel) wrapper, so every key starts with 'module.'; the plain model has no such prefix.\n"
        "Save ddp_model.module.state_dict(); to load an old file: "
        "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, 'module.').",
        sources=("https://github.com/pytorch/pytorch/issues/3805", "https://github.com/aks2203/deep-thinking/issues/5",
                 "https://github.com/pfnet/pfrl/pull/55")),
    Cause(
        "collective-list-size", "A gather's output list does not hold one tensor per rank",
        ("RuntimeError", "ValueError"),
        (r"invalid output tensor list.*expected length|Incorrect output list size|must match number of collective "
         r"participants|output tensor size must be equal to world_size",),
        "all_gather / gather write one tensor per rank: the output list (or tensor) must have world_size entries, and this one has another number.\n"
        "Make it [torch.empty_like(t) for _ in range(dist.get_world_size())] (or all_gather_into_tensor with world_size x the input's size).",
        sources=("https://github.com/pytorch/pytorch/issues/27440", "https://github.com/hiyouga/LlamaFactory/issues/9194")),
    Cause(
        "ddp-lazy-module", "DDP around a model whose layers are not built yet (Lazy modules)",
        ("RuntimeError",),
        (r"Modules with uninitialized parameters can't be used with `?DistributedDataParallel",),
        "The model has lazy layers (nn.LazyLinear, LazyConv...) whose shapes are set by a first forward; DDP must see every parameter's shape when it is built.\n"
        "Run one forward on a sample batch before wrapping: model(sample); ddp = DDP(model, ...).",
        sources=("https://github.com/pyg-team/pytorch_geometric/issues/9692", "https://github.com/bghira/SimpleTuner/issues/644")),
    Cause(
        "gather-list-non-dst", "A gather or scatter list given on a rank that is not its root",
        ("ValueError", "RuntimeError"),
        (r"``(gather|scatter)_list`` must NOT be specified on non-(destination|source) ranks",),
        "dist.gather writes its results only on the destination rank (dist.scatter reads its list only on the source "
        "rank); on every other rank the list must be left out, and this rank passed one.\n"
        "Pass the list on the root rank only: gather_list=[torch.empty_like(t) for _ in range(world)] "
        "if rank == dst else None (the same for scatter_list with src).",
        sources=("https://github.com/pytorch/pytorch/issues/25463",)),
    Cause(
        "sampler-shuffle-exclusive", "DataLoader(shuffle=True) beside a sampler",
        ("ValueError",),
        (r"sampler option is mutually exclusive with shuffle",),
        "A DataLoader takes its order from a sampler or from shuffle=True, not both: the DistributedSampler already "
        "shuffles (its own shuffle=True, a new order each epoch with set_epoch).\n"
        "Leave shuffle out of the DataLoader (shuffle=False) when you pass sampler=DistributedSampler(...).",
        sources=("https://github.com/ultralytics/yolov3/issues/231",)),
    Cause(
        "nccl-duplicate-gpu", "Two ranks on one GPU (NCCL: Duplicate GPU detected)",
        ("RuntimeError", "DistBackendError"),
        (r"Duplicate GPU detected",),
        "NCCL found two ranks of the job on the same CUDA device: every process used the default device "
        "(cuda:0), because none chose its own before init_process_group.\n"
        "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first in every rank (or pass device_id= to "
        "init_process_group), and put the model and tensors on that device.",
        sources=("https://github.com/NVIDIA/Megatron-LM/issues/661", "https://github.com/csguoh/MambaIR/issues/39")),
    Cause(
        "spawn-without-main-guard", "mp.spawn without `if __name__ == '__main__':`",
        ("RuntimeError",),
        (r"start a new process before the\s+current process has finished its bootstrapping phase",),
        "With the spawn start method each child imports the script again; at module level the spawn call runs again in every child.\n"
        "Put the start under `if __name__ == '__main__':` (or start the ranks with torchrun instead of mp.spawn).",
        sources=("https://github.com/pytorch/rl/issues/1805", "https://github.com/facebookresearch/mmf/issues/1182")),
)


# Readings whose premise only the rank hook's records hold (the process an exception was raised in, the calls
# the rank made, how it ended): a message's text alone never names them (``reasons.facts_from_text`` has no
# call records), so each is tested on a real run's records, not on a captured message (tests/test_causes.py).
FROM_RECORDS: tuple[Cause, ...] = (
    Cause(
        "process-group-in-worker", "torch.distributed called inside a DataLoader worker process",
        ("ValueError", "RuntimeError", "AssertionError"),
        (r"Default process group has not been initialized",),
        "init_process_group ran in the rank, but the call that needs it (dist.get_rank() in a Dataset's __getitem__, "
        "a collate function or a sampler) ran in a DataLoader worker process: a worker started with spawn or "
        "forkserver is a new process, with no process group.\n"
        "Read what the worker needs in the main process and keep it on the Dataset (self.rank = dist.get_rank() in "
        "its __init__, or int(os.environ['RANK'])); call no torch.distributed function from a worker.",
        # raised in a DataLoader worker of a rank whose own records show init_process_group called (not undone)
        premise=lambda f: f.in_worker and f.initialised,
        sources=("https://github.com/Lightning-AI/pytorch-lightning/issues/15734",)),
    Cause(
        "sys-exit-one-rank", "One rank ended itself with sys.exit while the others went on",
        ("SystemExit",),
        (r".",),
        "This rank called sys.exit with a non-zero code (its line is shown) on a condition the other ranks did not "
        "meet: it left without a traceback, and they failed or waited at their next collective without it.\n"
        "Decide the condition on every rank (or on one rank and share it: broadcast_object_list) so that all ranks "
        "leave together; raise an exception that says why instead of sys.exit, so the reason is in the log.",
        # the rank's own sys.exit(non-zero), not a framework's exit after an exception, and no other rank's
        premise=lambda f: f.exit_code is not None and not f.peers_exited,
        sources=("https://github.com/YalaLab/pillar-pretrain/pull/9",)),
    Cause(
        "path-differs-across-ranks", "Each rank worked in a folder of its own",
        ("FileNotFoundError", "RuntimeError", "OSError"),
        (r"No such file or directory|directory .*does not exist",),
        "The file this rank did not find lies in a path it printed, and the other ranks printed a different path at "
        "the same line (shown): each rank made the path for itself (its own clock, host or random draw), so what one "
        "rank wrote the others look for elsewhere.\n"
        "Decide the path once and give it to every rank: make it on rank 0 and share it "
        "(obj = [path]; dist.broadcast_object_list(obj, src=0); path = obj[0]), or build it from what every rank "
        "shares (an argument, TORCHELASTIC_RUN_ID), not from the time, the host name or a random draw.",
        # a file the exception is about lies under this rank's printed path, which another rank printed otherwise
        premise=lambda f: f.own_process and f.path_printed_apart,
        sources=("https://github.com/Lightning-AI/pytorch-lightning/pull/5629",
                 "https://github.com/DiamondLightSource/httomo/pull/721")),
    Cause(
        "checkpoint-dir-missing", "A file written into a folder that was never made",
        ("FileNotFoundError", "RuntimeError"),
        (r"No such file or directory|directory .*does not exist",),
        "The rank wrote a file (torch.save, open) into a folder that did not exist when it failed and still does not "
        "(the message names it): nothing made it.\n"
        "Make the folder before the first save, on every rank that writes there: os.makedirs(os.path.dirname(path), "
        "exist_ok=True) (or pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)).",
        # the folder of a file the exception is about was missing when the rank failed and is missing at the verdict
        premise=lambda f: f.own_process and any(p.folder_now is False for p in f.folder_missing_then),
        # a peer was still at work in its own code when the job was stopped: it may have been about to make it
        rules_out=lambda f: bool(f.peers_working),
        sources=("https://github.com/thunlp/KnowledgeablePromptTuning/issues/24",)),
    Cause(
        "dir-created-on-rank0-only", "A folder one rank makes, used by a rank that got there first",
        ("FileNotFoundError", "RuntimeError"),
        (r"No such file or directory|directory .*does not exist",),
        "The folder this rank wrote into did not exist when it failed, and exists now: another process of the job "
        "(one rank, rank 0 most often) made it later. The ranks race: the folder is made by one rank only, and the "
        "others do not wait for it.\n"
        "Make it on every rank with os.makedirs(folder, exist_ok=True) before writing, or make it on rank 0 and "
        "call dist.barrier() before any rank writes there.",
        # the folder was missing when the rank failed (the hook's record) and exists at the verdict
        premise=lambda f: f.own_process and any(p.folder_now for p in f.folder_missing_then),
        sources=("https://github.com/karpathy/nanochat/issues/315",
                 "https://github.com/EvolvingLMMs-Lab/lmms-engine/issues/93")),
)

FROM_RECORDS += (
    Cause(
        "rank0-only-state-dict", "A full state dict gathered to rank 0 only, loaded on every rank",
        ("RuntimeError",),
        (r"Missing key\(s\) in state_dict",),
        "FSDP's full state dict (FullStateDictConfig(rank0_only=True)) is gathered to rank 0 alone: on every other "
        "rank model.state_dict() returns an empty dict, and this rank loaded it (the empty value is shown).\n"
        "Load it on rank 0 only (and broadcast what the others need: dist.broadcast_object_list), or gather it to "
        "every rank (rank0_only=False), or save it on rank 0 and load the file on every rank after a dist.barrier().",
        # a rank other than 0 loaded an empty mapping into a module (load_state_dict raised) right after FSDP's own
        # gather (its last call record)
        premise=lambda f: (raised_in("load_state_dict", "torch/nn/modules/module.py")(f) and f.empty_argument
                           and f.rank not in (None, 0) and f.last_call_by_fsdp),
        # rank 0 failed the same way: the state was empty everywhere, not gathered to rank 0 only
        rules_out=lambda f: 0 in f.peers_same_error,
        sources=("https://github.com/pytorch/pytorch/issues/125177",)),
)

# A rank's error re-raised from one of its DataLoader workers, when nothing more specific names it: tried after
# every other text entry (signatures.CATALOG), before the catch-all for an arbitrary exception.
WORKER_EXCEPTION = Cause(
    "dataloader-worker-exception", "An exception raised in a DataLoader worker process, re-raised in the rank",
    (),
    (r"Caught \w+ in DataLoader worker process \d+",),
    "The error was raised in a DataLoader worker process the rank started (the Dataset's __getitem__, a transform, "
    "the collate function), not in the rank's own code: the rank re-raised it when it asked for the batch, and the "
    "other ranks then lost it. The worker's own line is shown.\n"
    "Fix what raised at the worker's line (the record, the transform); to step through it, num_workers=0 runs the "
    "same code in the rank itself.",
    # raised in a worker (the hook's record of the other process, or torch's own words for it)
    premise=lambda f: f.in_worker,
    sources=("https://github.com/microsoft/infinibatch/issues/17",))


# An exception raised in a concurrent.futures worker thread and re-raised at Future.result(), when nothing more
# specific names it: tried after the worker-process entry, before the catch-all (its premise is the frames'
# shape, true of any error raised there; a known cause raised in the thread is named first).
THREAD_EXCEPTION = Cause(
    "error-in-background-thread", "An exception raised in a background thread, shown later at Future.result()",
    (),
    (r".",),
    "The error was raised in a worker thread (a ThreadPoolExecutor's, running the function given to submit: an "
    "asynchronous checkpoint save), not in the line shown: the Future kept it, and the rank saw it only when it "
    "asked for the result, long after. The thread's own frames are in the traceback, under the result() call.\n"
    "Fix what raised in the thread (its innermost frames); ask for each result soon "
    "(future.result() before the next submit, or add_done_callback that logs the exception) so a failure shows "
    "where and when it happened.",
    # the exception's frames pass through a concurrent.futures worker's run and the Future's result()
    premise=lambda f: f.own_process and f.through_future,
    sources=("https://github.com/google/orbax/issues/605",))


def _library_causes() -> tuple[Cause, ...]:
    """A library's own exception, raised from its own files (``ddplab.engine.libraries``' data), as the
    cause in its terms: what it means, and the library's message itself as the evidence."""
    from ddplab.engine import libraries
    return tuple(
        Cause(f"{lib.id}-{''.join('-' + c.lower() if c.isupper() else c for c in type_name).strip('-')}",
              meaning, (type_name,), (r".",),
              f"The message is {lib.name}'s own, raised in its own code: it names what {lib.name} refused.\n{fix}",
              sources=lib.sources, premise=libraries.raised_by(lib))
        for lib in libraries.LIBRARIES for type_name, (meaning, fix) in lib.exceptions.items())


CAUSES = CAUSES + _library_causes()
