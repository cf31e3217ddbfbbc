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


def op(id, base, edits, status, culprit, cause, source, note, fault=0, also_fix=(), ranks=(2, 4, 8), check=False):
    return {"id": id, "base": base, "edits": [list(e) for e in edits], "status": status, "culprit": culprit,
            "cause": cause, "source": source, "note": note, "fault": fault, "also_fix": list(also_fix),
            "ranks": list(ranks), "check": check}


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
