"""The mutation operators: each one a mistake users reported (``source``: the thread where it was reported),
applied as a text edit at a marked place (``# @site:NAME`` in benchmarks/faults/bases/*.py, or ``re:REGEX`` on
a line of a lab script). Each mutant is labelled by construction:

- ``status``: what bare torchrun does with it ("failed": a rank exits with an error, "hung": no rank makes
  progress and none exits by itself, "ok": it ends with exit 0 and trains wrong);
- ``culprit``: the rank(s) that carry the mistake, as a rule over the world size ("0", "last", "nonzero", "all");
- the line to fix: the first line of the first edit (``fault`` picks another line of that edit), plus the
  lines of ``also_fix`` sites where a fix is just as right (e.g. a load that could strip a prefix);
- ``cause``: the cause class, mapped to the engine's accepted ids in causes.json (the one place to extend).

``ranks``: the world sizes the fault makes sense at (default 2, 4, 8). ``check``: run with ``check=True``
(the silent mistakes). Data only: benchmarks/faults/mutate.py applies them, run.py runs them.

Every label is checked under bare torchrun on each run of run.py (a mismatch is a suite error). While the
suite was built, that check corrected two predictions (reduce-on-master-only: gloo aborts rank 0, so
"failed", not "hung"; skip-backward-one-rank: the job ends with exit 0) and removed one operator (a second
forward before backward with BatchNorm raised no in-place error on CPU). A label found wrong later:
recv-grad-before-send's culprit was "all", but the last stage never runs the inserted receive (it sits
under ``if not last``) and every later stage waits in its unchanged receive of rank 0's activation, so
only rank 0 stands at the line to fix: its culprit is "0". Three run at 2 ranks only: the base divides its 4
accumulation steps by the world size, so from 4 ranks on there is one micro-step and sync-first-micro-step
and loss-not-scaled are the correct code; skip-backward-one-rank ends with exit 0 at 2 ranks only (at 4 bare
torchrun fails: its label is checked at 2).
"""

BASES = {
    "ddp_trainer": {"path": "benchmarks/faults/bases/ddp_trainer.py", "args": []},
    "gpt_accum": {"path": "benchmarks/faults/bases/gpt_accum.py", "args": []},
    "fsdp_train": {"path": "benchmarks/faults/bases/fsdp_train.py", "args": []},
    "pipeline": {"path": "benchmarks/faults/bases/pipeline.py", "args": []},
    "lab01": {"path": "labs/01_hang.py", "args": ["--variant", "fixed-sampler", "--quiet"]},
    "lab12": {"path": "labs/12_silent.py", "args": ["--variant", "module-update-fixed", "--epochs", "2"]},
}


def op(id, base, edits, status, culprit, cause, source, note, fault=0, also_fix=(), ranks=(2, 4, 8), check=False,
       round=""):
    return {"id": id, "base": base, "edits": [list(e) for e in edits], "status": status, "culprit": culprit,
            "cause": cause, "source": source, "note": note, "fault": fault, "also_fix": list(also_fix),
            "ranks": list(ranks), "check": check, "round": round}


OPERATORS = [
    # ---------------------------------------------------------------- init: the process group ----------
    op("nccl-on-cpu", "ddp_trainer", [("init", "replace", 'init_process_group(backend="nccl")')],
       "failed", "all", "nccl-without-gpu", "https://github.com/pytorch/pytorch/issues/159742",
       "backend='nccl' on a machine without CUDA"),
    op("world-size-two-nodes", "gpt_accum",
       [("init", "replace", 'init_process_group(backend="gloo", world_size=2 * int(os.environ["LOCAL_WORLD_SIZE"]),'
                            ' rank=int(os.environ["RANK"]))')],
       "hung", "all", "world-size-mismatch", "https://github.com/pytorch/pytorch/issues/52848",
       "world_size written for two nodes while one node runs: init waits for ranks that never come"),
    op("rank-hardcoded-zero", "gpt_accum",
       [("init", "replace", 'init_process_group(backend="gloo", rank=0, world_size=int(os.environ["WORLD_SIZE"]))')],
       "hung", "nonzero", "duplicate-rank", "https://github.com/pytorch/pytorch/issues/8091",
       "rank=0 written into init_process_group: every process claims rank 0"),
    op("master-port-override", "gpt_accum",
       [("init", "before", 'os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"')],
       "hung", "all", "store-address-override", "https://github.com/pytorch/pytorch/pull/89149",
       "a tutorial's MASTER_PORT=12355 kept in a script started by torchrun: the ranks dial a port no store "
       "listens on"),
    op("init-twice", "gpt_accum", [("init", "after", 'init_process_group(backend="gloo")')],
       "failed", "all", "process-group-initialized-twice", "https://github.com/NVIDIA/Megatron-LM/pull/521",
       "the script and a helper both call init_process_group"),
    op("world-size-before-init", "gpt_accum", [("init", "before", "ddp_world_size = dist.get_world_size()")],
       "failed", "all", "process-group-not-initialized", "https://github.com/megvii-model/YOLOF/issues/11",
       "torch.distributed queried before init_process_group"),
    op("local-rank-argparse", "gpt_accum",
       [("init", "before", 'import argparse\n'
                           'parser = argparse.ArgumentParser(); '
                           'parser.add_argument("--local_rank", type=int, required=True)\n'
                           'args = parser.parse_args()')],
       "failed", "all", "launch-local-rank-arg", "https://github.com/hkchengrex/XMem/issues/18",
       "a script written for torch.distributed.launch requires --local_rank, which torchrun does not pass",
       fault=1),
    # ---------------------------------------------------------------- crash: devices ---------------------
    op("cuda-set-device", "ddp_trainer", [("init", "after", 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))')],
       "failed", "all", "cuda-on-cpu", "https://github.com/karpathy/nanoGPT/issues/281",
       "torch.cuda.set_device on a machine without CUDA"),
    op("device-count-modulo", "ddp_trainer",
       [("init", "after", 'torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())')],
       "failed", "all", "device-count-zero", "https://github.com/open-mmlab/mmdetection/issues/368",
       "rank % torch.cuda.device_count() where device_count() is 0"),
    op("batch-per-gpu-zero-div", "gpt_accum",
       [("batch_size", "after",
         "batch_size = 16 // torch.cuda.device_count()  # the global batch split over the GPUs")],
       "failed", "all", "device-count-zero", "https://github.com/microsoft/CodeBERT/issues/47",
       "per-GPU batch = global batch // n_gpu with n_gpu == 0"),
    op("accelerator-none", "ddp_trainer",
       [("setup_call", "after", "device = torch.accelerator.current_accelerator().type")],
       "failed", "all", "accelerator-none", "https://github.com/vllm-project/compressed-tensors/issues/885",
       "torch.accelerator.current_accelerator() is None on a CPU-only machine"),
    op("device-ids-on-cpu", "ddp_trainer",
       [("wrap", "replace", "self.model = DDP(model, device_ids=[self.local_rank])")],
       "failed", "all", "ddp-device-ids-cpu", "https://github.com/pytorch/pytorch/issues/100243",
       "DDP(model, device_ids=[local_rank]) for a model on the CPU"),
    op("syncbn-on-cpu", "ddp_trainer",
       [("wrap", "replace", "self.model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(model))")],
       "failed", "all", "syncbn-on-cpu", "https://github.com/QData/spacetimeformer/issues/90",
       "SyncBatchNorm on CPU tensors"),
    # ---------------------------------------------------------------- crash: the model and DDP ----------
    op("unused-parameter", "ddp_trainer",
       [("model", "replace",
         "class Net(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.body = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))\n"
         "        self.aux_head = nn.Linear(32, 1)  # kept for a later experiment, not used in forward\n"
         "    def forward(self, x):\n"
         "        return self.body(x)\n"
         "return Net()")],
       "failed", "all", "unused-parameters", "https://github.com/ImprintLab/MedSegDiff/issues/27",
       "a layer defined in __init__ and never used in forward", fault=4),
    op("lazy-module", "ddp_trainer",
       [("model", "replace",
         "return nn.Sequential(nn.LazyLinear(32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))")],
       "failed", "all", "ddp-lazy-module", "https://github.com/pyg-team/pytorch_geometric/issues/9692",
       "a lazy layer whose shape is unknown when DDP wraps it"),
    op("frozen-model", "ddp_trainer",
       [("wrap", "before", "model.requires_grad_(False)  # freeze the backbone (here: the whole model)")],
       "failed", "all", "ddp-no-trainable-parameters", "https://github.com/pytorch/pytorch/issues/45326",
       "DDP around a model with no parameter that requires grad"),
    op("wrapper-attribute", "gpt_accum", [("wrap", "after", "context = model.wpe.num_embeddings")],
       "failed", "all", "ddp-wrapper-attribute", "https://github.com/ultralytics/yolov5/issues/90",
       "an attribute of the model asked of the DDP wrapper"),
    op("save-wrapper-state-dict", "ddp_trainer",
       [("save", "replace", 'snapshot = {"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}')],
       "failed", "all", "state-dict-module-prefix", "https://github.com/pytorch/pytorch/issues/3805",
       "the DDP wrapper's state dict saved ('module.' keys) and loaded into the plain model", also_fix=["load"]),
    op("read-before-rank0-writes", "ddp_trainer",
       [("setup_call", "after",
         'data_file = os.path.join(tempfile.gettempdir(), f"faults_data_{os.environ[\'MASTER_PORT\']}.pt")\n'
         'if int(os.environ["RANK"]) == 0:  # only rank 0 downloads\n'
         '    import time; time.sleep(2); torch.save(torch.rand(64, 21), data_file)\n'
         'rows = torch.load(data_file)')],
       "failed", "nonzero", "read-before-write", "https://github.com/pytorch/tutorials/pull/3066",
       "rank 0 downloads the data, the other ranks read it with no barrier between", fault=3),
    # ---------------------------------------------------------------- crash: collectives ----------------
    op("gather-list-non-dst", "gpt_accum",
       [("reduce_val", "after",
         "dist.gather(val, gather_list=[torch.zeros_like(val) for _ in range(ddp_world_size)], dst=0)")],
       "failed", "nonzero", "gather-list-non-dst", "https://github.com/pytorch/pytorch/issues/25463",
       "gather_list passed on every rank, not only on dst"),
    op("all-gather-list-size", "gpt_accum",
       [("reduce_val", "after", "vals = [torch.zeros_like(val) for _ in range(ddp_world_size - 1)]  # the other ranks\n"
                                "dist.all_gather(vals, val)")],
       "failed", "all", "collective-list-size", "https://github.com/pytorch/pytorch/issues/27440",
       "all_gather's output list without one tensor per rank", fault=1),
    op("all-gather-ragged", "gpt_accum",
       [("eval_loss", "after", "preds = logits.argmax(-1)[: 1 + ddp_rank]  # each rank keeps its valid rows\n"
                               "gathered = [torch.empty_like(preds) for _ in range(ddp_world_size)]\n"
                               "dist.all_gather(gathered, preds)")],
       "failed", "all", "collective-size-mismatch", "https://github.com/pytorch/pytorch/issues/56112",
       "all_gather of tensors whose length differs across ranks", fault=2),
    # ---------------------------------------------------------------- hang: collectives on some ranks ---
    op("reduce-on-master-only", "gpt_accum",
       [("log_if", "after", "    dist.all_reduce(val)"), ("reduce_val", "delete", "")],
       "failed", "0", "collective-on-some-ranks", "https://github.com/radixark/miles/pull/2684",
       "an all_reduce for logging inside `if master_process:`"),
    op("barrier-in-save-branch", "ddp_trainer",
       [("save_call", "after", "dist.barrier()  # wait until the file is written")],
       "hung", "0", "collective-on-some-ranks", "https://github.com/Lightning-AI/pytorch-lightning/issues/19045",
       "a barrier inside the rank-0 checkpoint branch"),
    op("rank0-sanity-forward", "ddp_trainer",
       [("save_call", "after", "self.model(torch.rand(4, 20))  # rank 0 checks the saved model still runs")],
       "hung", "0", "collective-on-some-ranks", "https://github.com/LibreYOLO/libreyolo/pull/594",
       "a forward through the DDP model on rank 0 only (DDP broadcasts buffers in forward)"),
    op("fsdp-state-dict-rank0", "fsdp_train",
       [("sd_ctx", "replace", "if rank == 0:  # only rank 0 writes the checkpoint\n"
                              "    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):"),
        ("state_dict", "replace", "    state = model.state_dict()")],
       "hung", "0", "collective-on-some-ranks", "https://github.com/pytorch/pytorch/issues/73383",
       "FSDP's full state dict gathered on rank 0 only (it is a collective)"),
    op("early-stop-one-rank", "gpt_accum",
       [("micro", "before", "if master_process and iter_num == 6:  # early stopping\n"
                            "    break")],
       "failed", "0", "early-exit-one-rank", "https://github.com/Lightning-AI/pytorch-lightning/issues/379",
       "the stop decision taken on one rank only: that rank leaves the loop"),
    op("skip-backward-one-rank", "gpt_accum",
       [("backward", "before", "if ddp_rank == ddp_world_size - 1 and iter_num == 5:  # no valid targets: skip\n"
                               "    continue")],
       "ok", "last", "backward-skipped-one-rank", "https://github.com/NVIDIA-NeMo/Automodel/pull/2468",
       "one rank skips a backward (a per-rank data check) while the others all-reduce: gloo pairs the next "
       "collectives out of step and the job ends with exit 0 (measured at 2 ranks; at 4 bare torchrun fails)",
       check=True, ranks=(2,)),
    op("uneven-shards", "ddp_trainer",
       [("sampler", "replace",
         "sampler = torch.utils.data.SubsetRandomSampler(shard_of(len(dataset)))  # each rank reads its own files"),
        ("re:^def prepare_dataloader", "before",
         "def shard_of(n, files=(24, 16, 16, 8)):\n"
         "    starts = [sum(files[:i]) for i in range(len(files))]\n"
         "    mine = [i for i in range(len(files)) if i % int(os.environ['WORLD_SIZE']) == int(os.environ['RANK'])]\n"
         "    return [j for i in mine for j in range(starts[i], starts[i] + files[i])]"),
        ("set_epoch", "delete", "")],
       "hung", "all", "uneven-inputs", "https://github.com/k2-fsa/snowfall/issues/152",
       "hand-made shards of different sizes: ranks run different numbers of steps"),
    # ---------------------------------------------------------------- hang: point to point --------------
    op("recv-grad-before-send", "pipeline",
       [("send_act", "before", "early = torch.empty(MICRO, WIDTH)\n"
                               "dist.recv(early, src=next_rank, tag=100 + m)  # 1F1B: take the gradient back at once")],
       "hung", "0", "p2p-order-deadlock", "https://github.com/NVIDIA/nccl/issues/479",
       "every stage but the last waits to receive before it sends: a cycle of blocking receives (only rank 0 gets "
       "to the new receive; the others wait in their unchanged receive of its activation)", fault=1),
    op("recv-wrong-shape", "pipeline",
       [("recv_buf", "replace", "x = torch.empty(MICRO * 2, WIDTH)  # sized for the full batch")],
       "failed", "nonzero", "p2p-size-mismatch", "https://github.com/NVIDIA/nccl/issues/1938",
       "a receive buffer whose size differs from what the peer sends"),
    # ---------------------------------------------------------------- out of memory ----------------------
    op("eval-whole-split", "gpt_accum",
       [("eval_batch", "replace", "X, Y = get_batch(split, bs=len(train_data) // 4)  # score the split in one batch")],
       "failed", "all", "out-of-memory", "https://github.com/quanvuong/handful-of-trials-pytorch/pull/9",
       "the validation loss computed on the whole split in one batch (the memory cap stands in for a GPU's)"),
    op("global-batch-per-rank", "gpt_accum",
       [("batch_size", "replace", "batch_size = 8 * 512  # the paper's batch size (global, used per rank here)")],
       "failed", "all", "out-of-memory", "https://github.com/Lightning-AI/pytorch-lightning/issues/9784",
       "a global batch size used as the per-rank batch (the memory cap stands in for a GPU's)"),
    op("sampler-with-shuffle", "ddp_trainer",
       [("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "replace",
         "return DataLoader(dataset, batch_size=batch_size, shuffle=True, sampler=sampler)")],
       "failed", "all", "sampler-shuffle-exclusive", "https://github.com/ultralytics/yolov3/issues/231",
       "shuffle=True kept from single-GPU code next to a DistributedSampler"),
    op("timeout-shorter-than-save", "ddp_trainer",
       [("init", "replace", "import datetime\n"
                            'init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=5))'),
        ("save_call", "before", "import time; time.sleep(8)  # a large checkpoint takes a while to write")],
       "failed", "nonzero", "timeout-too-short", "https://github.com/mosaicml/llm-foundry/pull/733",
       "a process-group timeout shorter than rank 0's checkpoint write: the other ranks time out waiting", fault=1),
    # ---------------------------------------------------------------- silent: data ----------------------
    op("no-set-epoch", "ddp_trainer", [("set_epoch", "delete", "")],
       "ok", "all", "no-set-epoch", "https://github.com/pytorch/pytorch/issues/31771",
       "DistributedSampler without set_epoch: the same order every epoch", check=True),
    op("no-distributed-sampler", "ddp_trainer",
       [("sampler", "replace", "sampler = torch.utils.data.RandomSampler(dataset)  # shuffle, as on one GPU"),
        ("set_epoch", "delete", "")],
       "ok", "all", "data-not-sharded", "https://github.com/Shark-NLP/DiffuSeq/issues/37",
       "no DistributedSampler: every rank trains on the whole dataset", check=True),
    op("unseeded-random-split", "ddp_trainer",
       [("dataset", "replace", "dataset, _ = torch.utils.data.random_split(MyTrainDataset(80), [64, 16])")],
       "ok", "all", "data-not-sharded", "https://github.com/TensorAuto/OpenTau/pull/498",
       "random_split with no generator: every rank draws a different split", check=True),
    op("sampler-one-replica", "lab01",
       [("re:sampler = DistributedSampler\\(data", "replace",
         "sampler = DistributedSampler(data, shuffle=True, seed=0, num_replicas=1, rank=0)")],
       "ok", "all", "data-not-sharded", "https://github.com/clovaai/voxceleb_trainer/issues/98",
       "a sampler told it is alone (num_replicas=1): the whole dataset on every rank", check=True),
    op("sampler-seed-per-rank", "lab12",
       [("re:sampler = DistributedSampler\\(train", "replace",
         'sampler = DistributedSampler(train, shuffle=not variant.startswith("bn-unsynced"), seed=seed + ctx.rank)')],
       "ok", "all", "data-not-sharded", "https://github.com/NVlabs/LongLive/issues/71",
       "DistributedSampler seeded with the rank: the ranks' shares overlap", check=True),
    op("same-seed-every-rank", "gpt_accum", [("seed", "replace", "torch.manual_seed(1337)")],
       "ok", "all", "data-not-sharded", "https://github.com/facebookresearch/detr/issues/297",
       "no per-rank seed offset: every rank draws the same random batches", check=True),
    op("fsdp-no-set-epoch", "fsdp_train", [("set_epoch", "delete", "")],
       "ok", "all", "no-set-epoch", "https://github.com/yangkky/distributed_tutorial/issues/5",
       "DistributedSampler without set_epoch (FSDP): the same order every epoch", check=True),
    op("set-epoch-per-rank", "ddp_trainer",
       [("set_epoch", "replace", "self.train_data.sampler.set_epoch(epoch + self.global_rank)")],
       "ok", "all", "data-not-sharded", "https://github.com/yangkky/distributed_tutorial/issues/5",
       "set_epoch with a different epoch on each rank: the shares overlap", check=True),
    op("fsdp-init-per-rank", "fsdp_train", [("seed", "replace", "torch.manual_seed(rank)  # different init per rank")],
       "ok", "all", "init-differs-across-ranks", "https://github.com/pytorch/pytorch/issues/75870",
       "FSDP (sync_module_states off) built from a per-rank seed: the shards come from different inits", check=True),
    # ---------------------------------------------------------------- silent: gradients and replicas ----
    op("sync-first-micro-step", "gpt_accum",
       [("sync", "replace", "model.require_backward_grad_sync = (micro_step == 0)")],
       "ok", "all", "gradients-not-averaged", "https://github.com/Haian-Jin/LVSM/pull/22",
       "gradient sync on the first micro-step instead of the last: the step uses unsynced gradients", check=True,
       ranks=(2,)),
    op("loss-not-scaled", "gpt_accum",
       [("forward", "after", "loss = loss * gradient_accumulation_steps  # undo the scaling")],
       "ok", "all", "accumulation-scale", "https://github.com/hirofumi0810/neural_sp/issues/168",
       "the loss not divided by the accumulation steps: gradients N times too large", check=True, ranks=(2,)),
    op("buffer-sync-off", "ddp_trainer", [("wrap", "replace", "self.model = DDP(model, broadcast_buffers=False)")],
       "ok", "all", "buffers-not-synced", "https://github.com/XPixelGroup/BasicSR/issues/541",
       "broadcast_buffers=False (a workaround for the in-place error): BatchNorm stats drift apart", check=True),
    op("forward-through-module", "ddp_trainer",
       [("forward", "replace", "output = self.model.module(source)  # the unwrapped model, as in the RL trainers")],
       "ok", "all", "update-outside-ddp", "https://github.com/jingyaogong/minimind/issues/853",
       "the loss computed through model.module: DDP's hooks are never armed, gradients never averaged", check=True),
    op("fsdp-optimizer-before-wrap", "fsdp_train",
       [("wrap", "before", "optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)"),
        ("optimizer", "delete", "")],
       "ok", "all", "optimizer-before-wrap", "https://github.com/huggingface/accelerate/issues/3256",
       "the optimizer built before the FSDP wrap holds parameters FSDP no longer uses: nothing trains", check=True),
    # ---------------------------------------------------------------- added: real reports outside the catalog of
    # issue 32's start (ddplab.causes and the signatures at 60464d8 had no entry for their class)
    op("workers-per-gpu", "ddp_trainer",
       [("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "replace",
         "num_workers = (os.cpu_count() or 2) // torch.cuda.device_count()  # loader workers per GPU\n"
         "return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=num_workers)")],
       "failed", "all", "device-count-zero", "https://github.com/Noble-Lab/casanovo/pull/81",
       "the loader's workers split per GPU (cpu count // torch.cuda.device_count()), which is 0 on a CPU machine "
       "(also https://github.com/mzjb/DeepH-pack/pull/4)"),
    op("init-checkpoint-race", "gpt_accum",
       [("wrap", "before",
         "import tempfile, time\n"
         "init_path = os.path.join(tempfile.gettempdir(), f\"faults_init_{os.environ['MASTER_PORT']}.pt\")\n"
         "if master_process:  # rank 0 writes the initial weights every rank starts from\n"
         "    time.sleep(2); torch.save(model.state_dict(), init_path)\n"
         "model.load_state_dict(torch.load(init_path))")],
       "failed", "nonzero", "read-before-write", "https://github.com/allenai/OLMo/pull/234",
       "the initial checkpoint read by every rank before rank 0 has written it (no barrier between)", fault=4),
    op("fsdp-loader-shuffle", "fsdp_train",
       [("re:loader = DataLoader\\(data", "replace",
         "loader = DataLoader(data, batch_size=16, shuffle=True, sampler=sampler)  # shuffled, as before")],
       "failed", "all", "sampler-shuffle-exclusive", "https://github.com/AgatheSenellart/MultiVae/issues/33",
       "shuffle=True hard-coded in the DataLoader while distributed training passes a DistributedSampler"),
    op("rank0-preprocess-timeout", "gpt_accum",
       [("init", "replace", "import datetime\n"
                            'init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=5))'),
        ("seed", "after", "if ddp_rank > 0:\n"
                          "    dist.barrier()  # wait while rank 0 tokenizes the dataset\n"
                          "else:\n"
                          "    import time; time.sleep(8)  # tokenize the dataset and write the cache (rank 0 only)\n"
                          "    dist.barrier()")],
       "failed", "nonzero", "timeout-too-short", "https://github.com/JIA-Lab-research/LongLoRA/issues/45",
       "rank 0 prepares the dataset while the others wait in a barrier, longer than the process group's timeout "
       "(also https://github.com/Lightning-AI/pytorch-lightning/pull/19448)", fault=1),
    op("recv-buffer-dtype", "pipeline",
       [("recv_buf", "replace", "x = torch.empty(MICRO, WIDTH, dtype=torch.float16)  # activations travel in half")],
       "failed", "nonzero", "p2p-size-mismatch", "https://github.com/pytorch/pytorch/pull/165539",
       "a receive buffer of another dtype than the tensor the previous stage sends (float32): the byte sizes differ "
       "(also https://github.com/pytorch/pytorch/issues/102355)"),
    op("weighted-sampler-ddp", "ddp_trainer",
       [("sampler", "replace",
         "sampler = torch.utils.data.WeightedRandomSampler(torch.ones(len(dataset)), num_samples=len(dataset))"
         "  # balance the classes"),
        ("set_epoch", "delete", "")],
       "ok", "all", "data-not-sharded", "https://github.com/Parskatt/RoMa/issues/32",
       "a WeightedRandomSampler (class balance) in a DDP script: not a distributed sampler, every rank draws from "
       "the whole dataset", check=True),
    op("set-epoch-constant", "ddp_trainer",
       [("set_epoch", "replace", "self.train_data.sampler.set_epoch(0)  # the sampler's epoch")],
       "ok", "all", "no-set-epoch", "https://github.com/facebookresearch/ClassyVision/pull/118",
       "the epoch not passed on to the sampler (set_epoch with a constant): the same shuffle every epoch", check=True),
]

# ---------------------------------------------------------------- issue 41 item 6: held out by construction
# Written and labelled under bare torchrun before any engine rule for their class (round "h41"); engine at
# ec3bc48 when they were written. Each class is new to causes.json. RESULTS.md reports them apart.
# Shared pieces: record 6 of ddp_trainer's dataset stands at position 7 of epoch 0's shuffle (seed 0), so it
# falls to the last rank at 2, 4 and 8 ranks, in that rank's first batch.
_CORRUPT = ("dataset", "after",
            'dataset.data[6] = (torch.full((20,), float("nan")), dataset.data[6][1])  # record 6 is corrupt on disk')
_TWO_WORKERS = ("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "replace",
                "return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=2)")
_CHECK_INPUT = ("forward", "before", "if not torch.isfinite(source).all():\n"
                                     '    raise ValueError("non-finite values in the input batch")')


def h41(*args, **kw):
    return op(*args, round="h41", **kw)


FIRST_TIME_H41 = [
    # ---------------------------------------------------------------- DataLoader workers ------------------
    h41("worker-raises-bad-record", "ddp_trainer",
        [("re:return self\\.data\\[index\\]", "before",
          "x, y = self.data[index]\n"
          "if not torch.isfinite(x).all():\n"
          '    raise ValueError(f"record {index} is corrupt")'), _CORRUPT, _TWO_WORKERS],
        "failed", "last", "dataloader-worker-exception", "https://github.com/microsoft/infinibatch/issues/17",
        "a corrupt record raises inside a DataLoader worker process of one rank: the rank re-raises it as 'Caught "
        "ValueError in DataLoader worker process N' and the others lose their peer", fault=2),
    h41("worker-killed-bad-record", "ddp_trainer",
        [("re:return self\\.data\\[index\\]", "before",
          "x, y = self.data[index]\n"
          "if not torch.isfinite(x).all():  # decoding this record takes all the memory: the kernel kills the worker\n"
          "    import signal; os.kill(os.getpid(), signal.SIGKILL)"), _CORRUPT, _TWO_WORKERS],
        "failed", "last", "dataloader-worker-killed", "https://github.com/pytorch/pytorch/issues/8976",
        "a DataLoader worker of one rank is killed (SIGKILL, as by the OOM killer) on one record: 'DataLoader worker "
        "(pid N) is killed by signal' in a rank that itself was not killed "
        "(also https://github.com/CompVis/latent-diffusion/issues/76)", fault=2),
    h41("worker-timeout", "ddp_trainer",
        [("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "replace",
          "return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=1, timeout=2)"),
         ("re:return self\\.data\\[index\\]", "before",
          "import time; time.sleep(0.5)  # each record comes from a slow network filesystem")],
        "failed", "all", "dataloader-timeout", "https://github.com/MPI-Dortmund/tomotwin-cryoet/pull/57",
        "a DataLoader timeout shorter than a worker takes for one batch: 'DataLoader timed out after 2 seconds'"),
    h41("spawn-worker-get-rank", "ddp_trainer",
        [("re:return self\\.data\\[index\\]", "replace",
          "g = torch.Generator().manual_seed(1000 * dist.get_rank() + index)  # per-rank augmentation noise\n"
          "x, y = self.data[index]\n"
          "return x + 0.01 * torch.randn(20, generator=g), y"),
         ("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "replace",
          "return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler, num_workers=2,\n"
          '                  multiprocessing_context="spawn")  # fork is unsafe with threads')],
        "failed", "all", "process-group-in-worker", "https://github.com/Lightning-AI/pytorch-lightning/issues/15734",
        "the Dataset asks torch.distributed for the rank inside a spawned DataLoader worker, a new process with no "
        "process group (init_process_group was called, in the rank)"),
    h41("iterable-not-sharded-by-worker", "ddp_trainer",
        [("sampler", "replace",
          "class Shard(torch.utils.data.IterableDataset):  # this rank's share, streamed\n"
          "    def __iter__(self):\n"
          '        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])\n'
          "        return (dataset[i] for i in range(rank, len(dataset), world))\n"
          "    def __len__(self):\n"
          '        return len(range(int(os.environ["RANK"]), len(dataset), int(os.environ["WORLD_SIZE"])))\n'
          "return DataLoader(Shard(), batch_size=batch_size, num_workers=2)"),
         ("re:return DataLoader\\(dataset, batch_size=batch_size, shuffle=False", "delete", ""),
         ("set_epoch", "delete", "")],
        "ok", "all", "iterable-worker-duplicates", "https://github.com/pytorch/pytorch/issues/30599",
        "an IterableDataset sharded by rank but not by DataLoader worker: each of the 2 workers yields the rank's "
        "whole share, every sample twice per epoch (also https://github.com/huggingface/datasets/issues/3423)",
        fault=3, check=True),
    # ---------------------------------------------------------------- exceptions on one rank -------------
    h41("skip-bad-batch-one-rank", "ddp_trainer",
        [("re:^            self\\._run_batch\\(source, targets\\)", "replace",
          "try:\n"
          "    self._run_batch(source, targets)\n"
          "except ValueError as e:  # a bad batch: skip it and keep training\n"
          '    print(f"[rank{self.global_rank}] skipped a batch: {e}", flush=True)'), _CHECK_INPUT, _CORRUPT],
        "hung", "last", "exception-swallowed-one-rank", "https://github.com/Lightning-AI/pytorch-lightning/issues/6430",
        "an input check raises on one rank only (its batch holds a corrupt record) and the training loop catches "
        "it and skips the batch: that rank takes one step fewer than the others "
        "(also https://github.com/pytorch/torchtitan/issues/1790)", fault=2),
    h41("collective-in-except-handler", "ddp_trainer",
        [("re:^            self\\._run_epoch\\(epoch\\)", "replace",
          "try:\n"
          "    self._run_epoch(epoch)\n"
          "except Exception:  # save what we have before going down\n"
          "    path = [self.snapshot_path if self.global_rank == 0 else None]\n"
          "    dist.broadcast_object_list(path, src=0)  # every rank writes where rank 0 says\n"
          '    torch.save(self.model.module.state_dict(), f"{path[0]}.rank{self.global_rank}.failed")\n'
          "    raise"), _CHECK_INPUT, _CORRUPT],
        "failed", "last", "exception-propagating-into-collective",
        "https://github.com/Lightning-AI/pytorch-lightning/issues/6430",
        "the training loop is wrapped in try/except that saves a checkpoint (a broadcast of the path) before "
        "re-raising: one rank fails, enters the handler's broadcast alone, and gloo aborts it (SIGABRT, 'Received "
        "data size doesn't match') when the others' gradient all-reduce arrives: the first error is never shown. "
        "Labelled 'hung' when first written; bare torchrun with a 100 s wait showed the abort", fault=4),
    h41("sys-exit-rank0-check", "gpt_accum",
        [("seed", "after",
          "import sys\n"
          'out_dir = "/nonexistent/ddplab/out-gpt"  # the cluster\'s checkpoint folder\n'
          "if master_process and not os.path.isdir(out_dir):\n"
          '    print(f"error: {out_dir} does not exist", flush=True)\n'
          "    sys.exit(1)")],
        "failed", "0", "sys-exit-one-rank", "https://github.com/YalaLab/pillar-pretrain/pull/9",
        "a check only rank 0 makes ends it with sys.exit(1): no traceback, the others fail at the next collective",
        fault=4),
    # ---------------------------------------------------------------- processes and threads at exit ------
    h41("non-daemon-heartbeat", "ddp_trainer",
        [("setup_call", "after",
          'if int(os.environ["RANK"]) == 0:  # rank 0 reports progress to the dashboard\n'
          "    import threading, time\n"
          "    def heartbeat():\n"
          "        while True:\n"
          "            time.sleep(1)\n"
          '    threading.Thread(target=heartbeat, name="heartbeat").start()')],
        "hung", "0", "non-daemon-thread-at-exit", "https://github.com/lincc-frameworks/hyrax/pull/1011",
        "a non-daemon thread started on rank 0 never ends: the rank finishes main() and waits for it at interpreter "
        "shutdown, so torchrun never returns", fault=5),
    h41("child-process-at-exit", "ddp_trainer",
        [("setup_call", "after",
          'if int(os.environ["RANK"]) == 0:  # rank 0 uploads the checkpoints as they appear\n'
          "    import multiprocessing, time\n"
          "    def uploader():\n"
          "        while True:\n"
          "            time.sleep(1)\n"
          '    multiprocessing.Process(target=uploader, name="uploader").start()')],
        "hung", "0", "child-process-at-exit", "https://github.com/rwth-i6/returnn/issues/1497",
        "a non-daemon multiprocessing child started on rank 0 never ends: the rank's exit handler joins it forever",
        fault=5),
    h41("wait-for-file-after-barrier", "ddp_trainer",
        [("before_cleanup", "before",
          "import time\n"
          "if trainer.global_rank == 0:  # rank 0 merges the scores once every other rank has written its own\n"
          '    while not all(os.path.exists(f"{snapshot_path}.score{r}") for r in range(1, int(os.environ["WORLD_SIZE"]))): time.sleep(0.2)'),
         ("before_cleanup", "after",
          "if trainer.global_rank > 0:\n"
          '    open(f"{snapshot_path}.score{trainer.global_rank}", "w").write(f"{score}")')],
        "hung", "0", "file-handshake-deadlock", "https://github.com/awslabs/palace/issues/838",
        "rank 0 polls for files the other ranks write only after a barrier that rank 0 never reaches", fault=2),
    # ---------------------------------------------------------------- checkpoints -------------------------
    h41("checkpoint-dir-missing", "ddp_trainer",
        [("re:torch\\.save\\(snapshot, self\\.snapshot_path\\)", "replace",
          'torch.save(snapshot, os.path.join(self.snapshot_path[:-3], "checkpoints", "last.pt"))  # the run\'s folder')],
        "failed", "0", "checkpoint-dir-missing", "https://github.com/thunlp/KnowledgeablePromptTuning/issues/24",
        "rank 0 saves into a checkpoints/ folder nobody created: it fails in torch.save ('Parent directory ... does "
        "not exist') while the others wait at the next barrier and then lose their peer"),
    h41("dir-made-by-rank0-only", "ddp_trainer",
        [("save_if", "before",
          "import time\n"
          "ckpt_dir = self.snapshot_path[:-3]  # the run's folder: every rank saves its optimizer state there\n"
          "if self.global_rank == 0:\n"
          "    time.sleep(5); os.makedirs(ckpt_dir, exist_ok=True)  # (rank 0 first writes the run's metadata)\n"
          'torch.save(self.optimizer.state_dict(), os.path.join(ckpt_dir, f"optim_rank{self.global_rank}.pt"))')],
        "failed", "nonzero", "dir-created-on-rank0-only", "https://github.com/karpathy/nanochat/issues/315",
        "only rank 0 creates the checkpoint folder, every rank saves into it: the other ranks get there first and "
        "fail in torch.save ('Parent directory ... does not exist') (also "
        "https://github.com/EvolvingLMMs-Lab/lmms-engine/issues/93)", fault=3),
    h41("weights-only-load", "ddp_trainer",
        [("save", "replace",
          "import argparse\n"
          'snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch,\n'
          '            "ARGS": argparse.Namespace(lr=1e-2, batch_size=8)}')],
        "failed", "all", "weights-only-unpickling", "https://github.com/facebookresearch/seamless_communication/issues/159",
        "a checkpoint that holds the run's argparse Namespace, loaded with torch.load's weights_only default "
        "(True since torch 2.6): 'Weights only load failed' on every rank "
        "(also https://github.com/mlcommons/mlperf-automations/issues/465)", fault=1, also_fix=["load_file"]),
    h41("async-save-unpicklable", "ddp_trainer",
        [("save", "replace",
          'snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch,\n'
          '            "SCHEDULER": torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda e: 0.95 ** e)}'),
         ("re:torch\\.save\\(snapshot, self\\.snapshot_path\\)", "replace",
          "import concurrent.futures\n"
          "self.pending = concurrent.futures.ThreadPoolExecutor(1).submit(torch.save, snapshot, self.snapshot_path)"
          "  # in the background"),
         ("after_train", "before", "if self.global_rank == 0:\n"
                                   "    self.pending.result()  # the last checkpoint is on disk")],
        "failed", "0", "error-in-background-thread", "https://github.com/google/orbax/issues/605",
        "rank 0 saves its checkpoints in a background thread; the snapshot holds a scheduler with a lambda, which "
        "cannot be pickled: the error is raised in the thread and shown only later, at future.result()", fault=1),
    h41("load-strict-false-prefix", "ddp_trainer",
        [("load", "replace", 'model.load_state_dict(snapshot["MODEL_STATE"], strict=False)  # tolerate extra keys'),
         ("save", "replace", 'snapshot = {"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}')],
        "ok", "all", "state-dict-keys-ignored", "https://github.com/pytorch/examples/issues/1029",
        "the DDP wrapper's state dict ('module.' keys) loaded with strict=False: no key matches, nothing is "
        "loaded, the evaluation scores the untrained model", check=True),
    h41("mkdir-every-rank", "ddp_trainer",
        [("setup_call", "after",
          "out_dir = os.path.join(tempfile.gettempdir(), f\"faults_run_{os.environ['MASTER_PORT']}\")\n"
          "os.makedirs(out_dir)  # the run's output folder")],
        "failed", "all", "makedirs-race", "https://github.com/huawei-bayerlab/marigold-v2/pull/7",
        "every rank creates the run's output folder with os.makedirs (exist_ok=False): all but the first fail with "
        "FileExistsError (also https://github.com/allenai/allennlp/issues/3841)", fault=1),
    h41("fsdp-rank0-only-state-load", "fsdp_train",
        [("end_barrier", "before",
          "scorer = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))\n"
          "scorer.load_state_dict(state)  # every rank scores the checkpointed model")],
        "failed", "nonzero", "rank0-only-state-dict-empty", "https://github.com/pytorch/pytorch/issues/125177",
        "FSDP's full state dict with rank0_only=True is empty on the other ranks; loading it there fails with every "
        "key missing", fault=1, also_fix=["re:cfg = FullStateDictConfig"]),
    # ---------------------------------------------------------------- evaluation and logging -------------
    h41("eval-padding-duplicates", "ddp_trainer",
        [("before_cleanup", "before",
          "val = MyTrainDataset(51)  # the validation split\n"
          "val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))\n"
          "scorer = trainer.model.module.eval()\n"
          "sums = torch.zeros(2)\n"
          "with torch.no_grad():\n"
          "    for x, y in val_loader:\n"
          '        sums += torch.tensor([F.mse_loss(scorer(x), y, reduction="sum").item(), len(y)])\n'
          "dist.all_reduce(sums)\n"
          'print(f"[rank{trainer.global_rank}] val mse {sums[0] / sums[1]:.4f} over {int(sums[1])} samples", flush=True)')],
        "ok", "all", "eval-padding-duplicates", "https://github.com/pytorch/pytorch/issues/25162",
        "a distributed evaluation with DistributedSampler over 51 samples: the sampler pads with repeats to a multiple "
        "of the world size and the metric counts them (also https://github.com/roboflow/rf-detr/issues/1507)",
        fault=1, check=True),
    h41("eval-rank0-distributed-sampler", "ddp_trainer",
        [("before_cleanup", "before",
          "if trainer.global_rank == 0:  # rank 0 scores the validation split\n"
          "    val = MyTrainDataset(48)\n"
          "    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))\n"
          "    scorer, total, n = trainer.model.module.eval(), 0.0, 0\n"
          "    with torch.no_grad():\n"
          "        for x, y in val_loader:\n"
          '            total, n = total + F.mse_loss(scorer(x), y, reduction="sum").item(), n + len(y)\n'
          '    print(f"[rank0] val mse {total / n:.4f} over {n} samples", flush=True)')],
        "ok", "0", "eval-subset-on-one-rank", "https://github.com/zifuwan/Sigma/issues/41",
        "validation on rank 0 only, through a DistributedSampler: rank 0 scores its 1/world share and reports it as "
        "the whole split", fault=2, check=True),
    h41("eval-mode-left-on-rank0", "ddp_trainer",
        [("save_call", "after",
          "self.model.module.eval()  # rank 0 checks the snapshot before going on\n"
          "with torch.no_grad():\n"
          "    self.model.module(torch.rand(16, 20))")],
        "ok", "0", "eval-mode-not-restored", "https://github.com/ermongroup/ncsn/issues/2",
        "rank 0 puts the model in eval mode for a check and never back in train mode: from then on rank 0 trains "
        "with BatchNorm's running statistics (and broadcasts its buffers), the others with batch statistics "
        "(also https://github.com/fartashf/vsepp/issues/4)",
        check=True),
    h41("metric-summed-not-averaged", "gpt_accum",
        [('re:print\\(f"step \\{iter_num\\}', "replace",
          'print(f"step {iter_num}: val loss {val.item():.4f}", flush=True)  # all_reduce gives the mean')],
        "ok", "all", "metric-summed-not-averaged", "https://github.com/sanderwood/bgpt/issues/5",
        "the logged validation loss is the all_reduce SUM over ranks, read as the mean: world_size times too large",
        check=True),
    # ---------------------------------------------------------------- state that differs across ranks ----
    h41("scheduler-step-rank0", "gpt_accum",
        [("log_if", "after", "    scheduler.step()  # decay the learning rate at each evaluation"),
         ("optimizer", "after", "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)")],
        "ok", "all", "hyperparameter-differs-across-ranks", "https://github.com/rwth-i6/returnn/issues/1493",
        "the learning-rate scheduler stepped inside the master-only logging branch: rank 0 decays its learning rate, "
        "the others do not, and the replicas drift apart", check=True),
    h41("val-loss-not-reduced", "gpt_accum",
        [("reduce_val", "delete", ""),
         ('re:print\\(f"step \\{iter_num\\}', "replace",
          'print(f"step {iter_num}: val loss {val.item():.4f}", flush=True)')],
        "ok", "all", "metric-not-reduced-across-ranks", "https://github.com/Lightning-AI/litgpt/issues/599",
        "the validation loss logged by rank 0 is rank 0's own: no reduction across ranks, the other shards are "
        "never counted", check=True),
    h41("optimizer-state-rank0", "gpt_accum",
        [("optimizer", "after",
          "import tempfile\n"
          "resume = os.path.join(tempfile.gettempdir(), f\"faults_resume_{os.environ['MASTER_PORT']}.pt\")\n"
          "if master_process:  # (the earlier run's checkpoint: its scheduler had decayed the lr)\n"
          '    old = optimizer.state_dict(); old["param_groups"][0]["lr"] = learning_rate / 10\n'
          '    torch.save({"optimizer": old}, resume)\n'
          "dist.barrier()\n"
          "if master_process:  # resume: rank 0 reads the checkpoint (DDP broadcasts the weights)\n"
          '    optimizer.load_state_dict(torch.load(resume)["optimizer"])')],
        "ok", "all", "resume-state-on-one-rank", "https://github.com/vllm-project/speculators/pull/926",
        "on resume only rank 0 loads the checkpoint: DDP broadcasts the weights, but the optimizer's state (its "
        "learning rate) stays the fresh one on the other ranks", fault=6, check=True),
    h41("each-rank-own-model", "ddp_trainer",
        [("wrap", "replace", "self.model = model  # DDP(model) on GPU machines only"),
         ("save", "replace", 'snapshot = {"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}')],
        "ok", "all", "model-not-wrapped", "https://github.com/mapbox/robosat/pull/77",
        "the model is wrapped in DDP only on the GPU path: on CPU each rank trains its own model on its own shard, "
        "nothing is averaged (also https://github.com/kohya-ss/sd-scripts/issues/924)", check=True),
    h41("param-average-inplace", "gpt_accum",
        [("step", "after", "for p in model.parameters():  # keep the replicas identical\n"
                           "    dist.all_reduce(p)\n"
                           "    p /= ddp_world_size")],
        "failed", "all", "inplace-on-leaf-parameter", "https://github.com/JuliaWolleb/diffusion-anomaly/issues/9",
        "parameters averaged by hand outside torch.no_grad(): the in-place division of a leaf that requires grad "
        "raises on every rank (also https://github.com/pytorch/examples/pull/779)", fault=2),
    # ---------------------------------------------------------------- collectives' arguments -------------
    h41("all-reduce-python-float", "gpt_accum",
        [("re:val = torch\\.tensor\\(\\[losses", "replace", 'val = losses["val"].item()  # the loss as a number')],
        "failed", "all", "collective-on-non-tensor", "https://github.com/SCHENLIU/longformer-chinese/issues/15",
        "a Python float passed to dist.all_reduce: 'Invalid function argument. Expected parameter `tensor` of type "
        "torch.Tensor' on every rank"),
    h41("new-group-on-rank0", "gpt_accum",
        [("seed", "after",
          "if master_process:\n"
          "    log_group = dist.new_group(ranks=[0])  # the logger's own group (only rank 0 logs)\n"
          "eval_group = dist.new_group()  # evaluation's all_reduce, every rank"),
         ("reduce_val", "replace", "dist.all_reduce(val, group=eval_group)")],
        "hung", "0", "new-group-not-on-every-rank", "https://github.com/vllm-project/llm-compressor/pull/2869",
        "dist.new_group called inside `if master_process:`: alone it passes on gloo (torch 2.13), but every later "
        "group is then numbered differently on rank 0: rank 0 waits in the next new_group while the others go on "
        "to DDP's first collective (also https://github.com/pytorch/pytorch/pull/124268)", fault=1),
    h41("p2p-grad-tag-mismatch", "pipeline",
        [("send_grad", "replace", "dist.send(inputs[m].grad, dst=prev_rank, tag=m)  # the micro-batch's tag")],
        "hung", "last", "p2p-tag-mismatch", "https://github.com/pytorch/gloo/issues/308",
        "a gradient sent back with the activation's tag (m) while the previous stage receives tag 100 + m: the send "
        "and the receive never match (only the last stage gets to the changed send; the others wait upstream)"),
    # ---------------------------------------------------------------- collectives' arguments across ranks ----
    # (the h41-args helper, 2026-12-06: gloo's behaviour was measured on a bare script first, broadcast(src=rank)
    # hangs; these two operators were written after the rule collective-root-differs, so they are not held out;
    # their labels were checked under bare torchrun by run.py)
    h41("broadcast-src-own-rank", "gpt_accum",
        [("seed", "after",
          "flags = torch.tensor([float(eval_interval), float(max_iters)])  # the run's settings, from the leader\n"
          "dist.broadcast(flags, src=ddp_rank)")],
        "hung", "all", "collective-root-differs", "https://github.com/OpenPipe/ART/issues/919",
        "the broadcast's src is a rank index of this rank's own (as `dist.broadcast(flags, rank, group=tp)` in "
        "https://github.com/pytorch/xla/commit/13485454e88c52cdaa99acd54df0f3dec6afb0ad, and a group-local index "
        "passed as the global src in ART #919 and https://github.com/meta-pytorch/torchrec/pull/4601): each rank "
        "names itself the root, and on gloo both wait in the broadcast for ever", fault=1),
    h41("all-gather-uneven-batch", "gpt_accum",
        [("reduce_val", "after",
          "preds = torch.randn(batch_size - ddp_rank % 2)  # the last batch of an uneven split: one fewer on odd ranks\n"
          "gathered = [torch.zeros(batch_size) for _ in range(ddp_world_size)]\n"
          "dist.all_gather(gathered, preds)")],
        "failed", "nonzero", "collective-size-mismatch", "https://github.com/Lightning-AI/pytorch-lightning/issues/7773",
        "all_gather of per-rank predictions whose last batch is shorter on some ranks: tensors of different shapes "
        "(the report: it freezes on NCCL; gloo raises 'invalid tensor size' on the rank whose tensor does not fit)",
        fault=2),
    # ---------------------------------------------------------------- values each rank computes alone ----
    # Written for the printed-values channel (engine/printed.py) after it was built, so not held out: they measure
    # that the channel states what each rank printed, and that it adds no wrong claim.
    h41("run-dir-timestamp-per-rank", "ddp_trainer",
        [("re:snapshot_path = os\\.path\\.join\\(tempfile", "replace",
          "import datetime  # each run's folder is named by its start time, to the microsecond (hydra's ${now:...})\n"
          "run_dir = os.path.join(tempfile.gettempdir(), f\"faults_runs_{run_id}\", "
          "datetime.datetime.now().strftime(\"%Y-%m-%d_%H-%M-%S.%f\"))\n"
          "os.makedirs(run_dir, exist_ok=True)\n"
          "print(f\"[rank{os.environ['RANK']}] run dir: {run_dir}\", flush=True)\n"
          "snapshot_path = os.path.join(run_dir, \"snapshot.pt\")")],
        "failed", "nonzero", "run-dir-differs-across-ranks", "https://github.com/Lightning-AI/pytorch-lightning/pull/5629",
        "each rank names the run's folder by its own clock: rank 0 saves the snapshot into its folder, every rank "
        "loads it from its own, and the others fail with FileNotFoundError (Lightning-AI/pytorch-lightning#5512, "
        "fixed by #5629: 'non-rank 0 processes referring to the wrong folder ... crash with a file not found "
        "error'; also https://github.com/DiamondLightSource/httomo/pull/721, which broadcasts the timestamp)",
        fault=1),
    h41("lr-from-rank-progress", "gpt_accum",
        [("step", "before",
          "docs_seen += int((X == 0).sum())  # token 0 ends a conversation: each rank packs its own number\n"
          "lrm = get_lr_multiplier(docs_seen / (max_iters * batch_size * block_size / vocab))  # progress, per rank\n"
          "for group in optimizer.param_groups:\n"
          "    group[\"lr\"] = learning_rate * lrm\n"
          "print(f\"step {iter_num} | rank {ddp_rank} lr multiplier: {lrm:.9f}\", flush=True)"),
         ("optimizer", "after",
          "docs_seen = 0  # conversations consumed: the progress through the data\n"
          "def get_lr_multiplier(progress):  # constant, then a linear warmdown over the second half\n"
          "    return 1.0 if progress < 0.5 else max(0.0, (1.0 - progress) / 0.5)")],
        "ok", "all", "hyperparameter-differs-across-ranks", "https://github.com/karpathy/nanochat/pull/857",
        "the learning-rate multiplier follows each rank's own progress through its data (conversations packed per "
        "batch differ by rank): alike on every rank during the constant phase, apart once the warmdown starts; each "
        "rank prints its own (the report's repro does the same)", fault=1, check=True),
]
OPERATORS += FIRST_TIME_H41
