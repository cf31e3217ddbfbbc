"""The claims register: every article sentence the workbook tests, once (rules in ``ddplab.course.claims``).

A ``Claim`` holds the quotation (one sentence, or a contiguous part of one, word for word; tests
find it in its article where the text is at hand), its article's key (``ddplab.course.articles``), the
criterion, and under ``parts`` which lab supplies which part. Each lab's ``claim_inputs(runs)`` in
``ddplab.course.labNN`` returns ``claims.Inputs(LAB, {key: claims.evidence(measured, part=...)})``
with exactly the parts listed here for it; the verdict is computed in ``ddplab.course.claims`` alone.

Adding a lab's claims (lab NN):
1. For a sentence already here, add ``"NN": ("its_part", ...)`` to that claim's ``parts`` and say in
   its criterion what the part is; a lab that only quotes it goes in ``shown_in``.
2. For a new sentence, append a ``Claim``; a ClaimSpec(key, article, quote, criterion, parts) written
   for one lab becomes ``Claim(key, article, quote, criterion, {"NN": parts})``.
3. A part no run can measure goes in ``unmeasured`` with the reason; the part the sentence asserts
   (not its hedge) goes in ``decisive`` when a run can show it false; a part the sentence says only
   "can" (might, potentially, suggests) happen goes in ``hedged`` with that word. Frequency words
   ("primary reason", "typically", ...) need nothing: ``claims.judge`` adds them, not measured.
4. ``tests/test_claims.py`` then checks the quotation, that no sentence is registered twice, and that
   the notebook shows the rows (after it is executed).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ddplab.course.notebook import P_LEVEL

# Lab 11's thresholds, stated by its claim's criterion (the lab measures against them)
LOSS_RTOL = 0.01     # autocast loss within 1 % of float32's at every step
FASTER = 1.25        # "significantly": at least 1.25x less time per step


@dataclass(frozen=True)
class Claim:
    """One article sentence, once. ``parts``: {lab: part names that lab's runs supply};
    ``unmeasured``: {part: why no lab can measure it}; ``decisive``: the parts that, shown false,
    make the claim wrong; ``hedged``: {part: the quotation's word that says it only can happen ("can",
    "might", "potentially", "suggests")}: shown false in the settings measured, such a part is "not
    shown", not refuted; ``shown_in``: further notebooks that quote it without supplying a part. A
    frequency word in the quotation is a part no run measures: ``claims.judge`` adds it."""
    key: str
    article: str            # "000".."003" (ddplab.course.articles)
    quote: str              # one sentence, or a contiguous part of one, word for word
    criterion: str
    parts: dict
    unmeasured: dict = field(default_factory=dict)
    decisive: tuple = ()
    hedged: dict = field(default_factory=dict)
    shown_in: tuple = ()

    @property
    def labs(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.parts) | set(self.shown_in)))

    @property
    def source(self) -> str:
        from ddplab.course.articles import article
        return article(self.article).cite()


LATENCY = ("no lab adds latency to a link: Linux delays packets only with the netem qdisc, which the machine the "
           "course was built on lacks (tc: 'Specified qdisc kind is unknown'); only the bandwidth was capped")

REGISTER: tuple[Claim, ...] = (
    # ---- article 000: Why do PyTorch's DataParallel and DistributedDataParallel implementations hang indefinitely?
    Claim(
        "most-frequent-cause", "000",
        "I've observed this issue most frequently arises from neglecting the intricacies of data movement across "
        "multiple processes, and less frequently from deadlocks caused by improper barrier synchronization.",
        "a statement of how often each cause occurs in practice; no run counts that",
        parts={}, shown_in=("01",)),
    Claim(
        "custom-loop-deadlock", "000",
        "This is less frequent with PyTorch's higher-level APIs, but can occur in custom implementations of "
        "training loops interacting with `DataParallel` or `DDP`.",
        "'less frequent' is a frequency no run measures. Lab 01: both custom DDP loops (hand-made uneven shards; a "
        "barrier under `if rank == 0:`) end hung with the ranks waiting in different collectives, and the same loop "
        "finishes with the higher-level APIs (DistributedSampler, Join). Lab 10: a custom loop that evaluates on rank 0 "
        "alone through the DDP wrapper deadlocks (judged hung, every rank blocked in a collective, rank 0 in DDP's own "
        "buffer broadcast), and the same loop evaluating model.module completes",
        parts={"01": ("custom_loops_deadlock", "higher_level_apis_finish"),
               "10": ("eval_on_rank0_deadlocks", "eval_on_module_completes")},
        hedged={"custom_loops_deadlock": "can", "eval_on_rank0_deadlocks": "can"}),
    Claim(
        "indefinite-sync", "000",
        "The primary reason for indefinite hangs in PyTorch's DataParallel and DistributedDataParallel (DDP) "
        "implementations stems from improper handling of inter-process communication and synchronization, "
        "particularly concerning gradient aggregation and model state updates.",
        "'primary reason' says how often, a frequency no run counts. Two measured parts: (1) the hang is a "
        "synchronization error at gradient aggregation: a rank waits in DDP's gradient all-reduce while its peer is "
        "in another collective; (2) it is indefinite: with PyTorch's default timeout (30 minutes for gloo) the job "
        "does not end by itself. A run with a shorter timeout shows what that timeout does, not the default: "
        "then, and when the default's wait is not sat out, (2) is not established",
        parts={"01": ("sync_at_gradient_aggregation", "indefinite")}),
    Claim(
        "oom-hangs-silently", "000",
        "Running out of GPU memory (especially with large batch sizes or models) on one or more devices can "
        "cause processes to hang, often without clear error messages.",
        "(1) a process hangs: the job ends hung (no rank made progress); (2) no clear message: the rank that ran out "
        "leaves no Python error and no log line that names memory. Both are about GPU memory: the oom-killer run "
        "(host memory under the kernel's OOM killer, in a cgroup) is a stand-in that judges neither",
        parts={"02": ("hang", "no_clear_message")}),
    Claim(
        "hang-in-gradient-aggregation", "000",
        "This can manifest indirectly as a hang during gradient aggregation.",
        "(1) a GPU allocation fails on one rank: without a GPU an RLIMIT cap on host memory stands in (it raises "
        "the same kind of Python exception) and judges nothing about GPU memory; (2) the rank that caught the failed "
        "allocation and carried on (skip-batch) leaves the job hung with a peer waiting in DDP's gradient all-reduce "
        "(issued by backward)",
        parts={"02": ("gpu_allocation_fails", "hang_in_gradient_all_reduce")}),
    Claim(
        "smaller-batch-fixes", "000",
        "The solution involves reducing the batch size or increasing the GPU memory available.",
        "two parts, both about GPU memory: (1) a smaller (micro-)batch fits where the full batch did not "
        "(fixed-accumulate finishes ok, its peak under the cap, the full batch's over it): under a host-memory cap, a "
        "stand-in for the GPU's memory; (2) more GPU memory: not measured without a GPU. That accumulating the "
        "micro-batches gives the full batch's gradient is ddplab's own check of the fix, shown, not a part: the "
        "article does not say it",
        parts={"02": ("smaller_batch_fits",)},
        unmeasured={"more_gpu_memory": "no GPU here; lifting a host cap shows only that the full batch's peak is above it"}),
    Claim(
        "example3-hang", "000",
        "If different processes receive input tensors of varying shapes, the all_reduce operation will fail "
        "silently or produce incorrect results, leading to a hang.",
        "judged on the article's Example 3 (10 rows on rank 0, 20 on rank 1, into DDP). Two parts: (1) incorrect "
        "results: DDP's averaged gradient differs from the single-process gradient over all 30 rows by more than "
        "1% (relative); (2) a hang: the run ends hung (no rank made progress). The hang is what the sentence asserts: "
        "a run that finishes shows it wrong",
        parts={"03": ("incorrect_results", "hang")}, decisive=("hang",)),
    Claim(
        "mismatch-errors-hang", "000",
        "Using improperly formatted input tensors across processes, for instance mismatched tensor dimensions or "
        "data types, can lead to errors in the collective operations, resulting in the hang.",
        "judged on the runs whose collectives really see different shapes or data types: gather-ragged (an "
        "all_gather of 7 vs 6 rows), model-mismatch (parameter shapes that differ, checked by DDP) and dtype-mismatch "
        "(an all_reduce of float32 on rank 0, float64 on rank 1). Two parts: (1) errors in the collective "
        "operations: all three runs fail with an error raised in or around the collective; (2) the hang: any of "
        "them ends hung. dtype-same-width (float64 against int64, as many bytes) is shown beside them, not a part: "
        "'can lead to' is not contradicted by a mismatch that raises nothing, nor by runs that do not hang: gloo "
        "checks sizes; NCCL, which has no such check and can hang, is not run here",
        parts={"03": ("errors", "hang")}, hedged={"errors": "can", "hang": "can"},
        unmeasured={"hang_with_nccl": "NCCL has no size check like gloo's (a ragged all_gather can hang until its "
                                      "watchdog's timeout): no GPUs here, so not run"}),
    Claim(
        "cryptic-errors", "000",
        "PyTorch's error handling in this area can sometimes be cryptic.",
        "holds if the error of the bare gather-ragged run (gloo, no debug settings) names neither the ranks' tensor "
        "shapes nor the collective (only byte counts); wrong if it names the shapes",
        parts={"03": ("cryptic",)}),
    Claim(
        "gloo-congested", "000",
        "If the network connecting the processes is slow or unreliable (e.g., using `gloo` over a congested network), "
        "the `all_reduce` operation used to aggregate gradients will be significantly delayed, potentially appearing "
        "as a hang.",
        "judged on lab 09's two nodes: (1) significantly delayed: plain DDP's step (its gradient all-reduce over gloo) "
        "at the lowest link cap takes at least twice the uncapped step; (2) potentially appearing as a hang: the job "
        "with a share of node 1's packets dropped is judged hung (no rank made progress for the stall window). Lab "
        "07's all-reduce on loopback is shown, not judged: loopback is no network",
        parts={"07": (), "09": ("delayed_on_a_slow_link", "looks_hung_on_a_lossy_link")},
        hedged={"looks_hung_on_a_lossy_link": "potentially"}),
    Claim(
        "bandwidth-impedes", "000",
        "Insufficient network bandwidth or latency between machines in a DDP setup can significantly impede "
        "communication.",
        "bandwidth: plain DDP's step at the lowest link cap takes at least twice the uncapped step, and communication "
        "(the step minus the compute-only step) is most of it; latency: a link with added latency does the same",
        parts={"09": ("step_2x_slower", "communication_dominates")}, unmeasured={"latency": LATENCY}),
    Claim(
        "stall-indefinitely", "000",
        "Packets might be dropped or delayed, causing processes to stall indefinitely while waiting for others.",
        "with a share of node 1's incoming packets dropped, against the same job without loss run just before: the "
        "'dropped' half holds if the lossy job's steps are slower (every timed step, the slowest rank's time at "
        f"each; a one-sided rank-sum test, p <= {P_LEVEL}: the delays of retransmission are in the slow steps, "
        "which a fastest step would hide); the 'stall indefinitely' half holds if the job is judged hung (no rank "
        "made progress for the stall window). Both are what 'might' happen: one loss rate that shows neither "
        "refutes them",
        parts={"09": ("slower", "stalls")}, hedged={"slower": "might", "stalls": "might"}),
    Claim(
        "illusion-of-hang", "000",
        "If the transfer speed is significantly slower than the computation speed, processes will spend "
        "most of their time waiting, creating the illusion of a hang.",
        "data slower than compute (here rank 1's samples: a storage latency imitated with a sleep, and real "
        "decoding in its DataLoader worker). Holds if both ranks spend over half their time waiting, one "
        "wait lasts longer than ddplab's stall window (silent long enough to look hung), and the run still "
        "ends ok (it was not a hang)",
        parts={"11": ("mostly_waiting", "looks_hung", "not_hung")}),
    Claim(
        "init-no-env", "000",
        'dist.init_process_group("gloo", rank=rank, world_size=world_size)  # Or "nccl" for NVIDIA GPUs',
        "holds if this call, in the sample's environment (mp.spawn sets no MASTER_ADDR/MASTER_PORT), joins "
        "the process group; wrong if it raises",
        parts={"08": ("joins",)}),

    # ---- article 001: How can I resolve PyTorch DistributedDataParallel issues?
    Claim(
        "frequent-allreduce", "001",
        "This might be caused by overly frequent all-reduce operations or inefficient data transfer protocols.",
        "two parts, each a timing test at p <= the stated level: (1) lab 07, against the baseline of the same run "
        "(large model, small batch, DDP), round by round: fewer all-reduces per sample (batch x k, or no_sync "
        "accumulation) raise samples/s by more than 10% (a sign test over the rounds; the better of the two fixes, "
        "its p doubled for choosing it); (2) lab 09, on a capped link between two nodes: fewer bytes per "
        "all-reduce (a compression hook, timed step by step beside plain DDP in one run) make a step more than 10% "
        "faster (a rank-sum test; the better hook, its p doubled). Lab 07's compression on loopback is shown, not "
        "judged: loopback is no network",
        parts={"07": ("fewer_allreduces_faster",), "09": ("fewer_bytes_faster_on_a_link",)}),
    Claim(
        "accumulation", "001",
        "This example shows how to incorporate gradient accumulation.",
        "holds if, for every k > 1 micro-batches per step, the gradient the article's loop hands to "
        "optimizer.step() equals the mean gradient of all k micro-batches (max |diff| <= 1e-5, float32); "
        "wrong if it does not (for example, if it equals the last micro-batch's alone)",
        parts={"08": ("accumulates",)}),
    Claim(
        "scale-loss", "001",
        "Note the use of `amp.scale_loss` to handle gradient scaling appropriately in mixed precision.",
        "judged only on loss scaling that does something: lab 08's article loop would need apex itself (deprecated, "
        "not installed; bf16 autocast without scaling stands in). Lab 11, with torch.amp.GradScaler, amp.scale_loss's "
        "successor, on fp16: the scaled update equals the unscaled one, and when only rank 1's local gradient holds "
        "inf/NaN, every rank skips that step with the same new scale and equal weights. GradScaler under bf16 on a "
        "CPU is a stand-in (bf16 needs no scaling)",
        parts={"08": ("apex_scale_loss",), "11": ("same_update", "skipped_everywhere", "scales_agree", "weights_agree")}),
    Claim(
        "sampler-balanced", "001",
        "This prevents one worker from receiving significantly more data than others, which can lead to "
        "imbalanced model updates.",
        "holds if, every epoch, both ranks get the same number of indices and together visit the dataset "
        "exactly once (the article's DistributedSampler, with and without set_epoch)",
        parts={"08": ("equal_shares", "covers_once")}),
    Claim(
        "sampler-reset", "001",
        "The sampler should be reset before each epoch.",
        "holds if, without sampler.set_epoch(epoch), every rank visits its indices in the same order every "
        "epoch, and with it the order changes: the reset is what makes shuffle=True shuffle again. Lab 08 reads "
        "the orders its ranks record; lab 12 asks `ddplab run --check`, which reads them from inside the "
        "learner's DataLoader: it reports the same order every epoch without set_epoch (no-set-epoch) and "
        "none with it (no-set-epoch-fixed)",
        parts={"08": ("repeats_without_reset", "changes_with_reset"),
               "12": ("check_finds_same_order", "check_clean_with_reset")}),
    Claim(
        "uneven-data", "001",
        "Uneven data distribution among workers can cause discrepancies in model updates, leading to divergence "
        "and inaccurate results.",
        "all three are what 'can' happen: a setting that shows none refutes nothing. (1) discrepancies in model "
        "updates: lab 03's ranks with unequal shares (10 and 20 rows) get a DDP-averaged gradient more than 1% "
        "(relative) from the gradient of all their rows; (2) divergence (lab 12): a run whose ranks read data "
        "distributed differently ends with the ranks' replicas different (`--check`: replicas-differ or "
        "buffers-differ): rank-split (equal random halves, overlapping) or bn-unsynced (each rank its own source, "
        "DDP's buffer sync off); (3) inaccurate results: one broken and one fixed run's validation losses are "
        "shown, not judged",
        parts={"03": ("unequal_shares_skew_the_update",), "12": ("replicas_diverge",)},
        hedged={"unequal_shares_skew_the_update": "can", "replicas_diverge": "can"},
        unmeasured={"inaccurate_results": "the validation loss of one seed's broken and fixed runs is shown, not "
                                          "judged: a difference between two single runs is no test"}),
    Claim(
        "accumulation-misuse", "001",
        "Incorrectly handling gradient accumulation (e.g., in scenarios with limited batch sizes) can result in "
        "unexpected gradient updates or even data corruption.",
        "judged on lab 12's step-in-no-sync (optimizer.step() inside no_sync()) against its fix: the part holds "
        "if `--check` finds steps on gradients that were never averaged and replicas that drifted apart in the "
        "broken run, and neither in the fixed one. Data corruption is not examined",
        parts={"12": ("unexpected_updates",)},
        unmeasured={"data_corruption": "no run examines data corruption"}),
    Claim(
        "manifestations", "001",
        "Issues with `DistributedDataParallel` typically manifest in various ways: deadlocks, inconsistent model "
        "states across processes, slow training speed, or outright runtime errors.",
        "'typically' is a frequency no run measures. Model code of lab 10 produces each of the four: a deadlock "
        "(eval-rank0 judged hung with every rank blocked in a collective); inconsistent model states across processes, "
        "two ways: module-forward ends ok with the ranks' parameters apart (training past the wrapper), and rank-init "
        "(torch.manual_seed(rank) before building the model) ends ok with a state the forward uses different across "
        "ranks after training (a plain tensor attribute, or parameters re-initialised after wrapping; DDP's broadcast "
        "at construction evens out parameters built with the rank's seed, shown but not a part); slower training "
        "(find_unused_parameters=True's step slower than the reference's in so many of the interleaved rounds that a "
        f"sign test rules out chance, p <= {P_LEVEL}); and a runtime error (unused-params fails with DDP's own "
        "RuntimeError)",
        parts={"10": ("deadlock", "states_apart_past_the_wrapper", "states_apart_from_rank_init", "slow_training",
                      "runtime_error")}),
    Claim(
        "wrong-backend", "001",
        "This includes using the wrong backend (e.g., Gloo for single-machine multi-GPU, NCCL for multi-node "
        "setups) or neglecting to properly handle world size and rank.",
        "Lab 06, three parts: (1) the wrong backend for the hardware fails: init_process_group('nccl') with the "
        "tensors on the CPU ends failed with an error naming NCCL or the device (nccl-without-gpu on a CPU build of "
        "torch, no-backend-for-device on a CUDA build), not hung; (2) the backend chosen from the hardware (nccl with a "
        "GPU per rank, else gloo) runs the same collective ok; (3) a rank given another WORLD_SIZE cannot form the "
        "process group (env-mismatch, world-size). The article's two examples need GPUs and are not parts",
        parts={"06": ("wrong_backend_fails", "right_backend_runs", "world_size_mismatch_fails")},
        unmeasured={"gloo_single_machine_multi_gpu": "gloo across several GPUs of one machine: no machine here has 2 GPUs",
                    "nccl_multi_node": "NCCL across nodes: no GPUs here; NCCL is PyTorch's recommended backend for "
                                       "multi-node GPU training, so this example reads as a slip the course cannot test"}),
    Claim(
        "amp-performance", "001",
        "The code also demonstrates the use of `apex` for mixed precision training, which can improve "
        "performance significantly.",
        f"apex is deprecated; torch.amp is its successor. Holds if the autocast step is at least {FASTER}x "
        f"faster than float32's and keeps less memory (saved activations), with the loss within {LOSS_RTOL:.0%} at every "
        "step. Judged only on a GPU with fp16 (the article's setting): bf16 on a CPU is a stand-in",
        parts={"11": ("faster", "less_memory", "same_loss")}),

    # ---- article 002: Why is training not starting with nn.DataParallel?
    Claim(
        "example1-error", "002",
        "In this example, when a batch of varying sequence lengths is presented to DataParallel, it might "
        "generate error due to the padding implemented in pad_sequence.",
        "judged on the article's Example 1 code as written (nn.Linear(10, 20) on pad_sequence batches of its "
        "lengths 10-40, batch 4) under real nn.DataParallel on 2 GPUs: holds if a step raises an error; wrong if "
        "every step trains. The CPU emulation is a stand-in and judges nothing",
        parts={"04": ("raises",)}),
    Claim(
        "lstm-more-evident", "002",
        "Note that the error may not appear, but it will be more evident in more complex structures (e.g. "
        "LSTM-like structures).",
        "two parts, under real nn.DataParallel on 2 GPUs: (1) the error may not appear: Example 1 (nn.Linear) "
        "trains every step; (2) it is evident with an LSTM-like structure: the extension (an LSTM packing the "
        "padded batch, pad_packed_sequence without total_length) fails in gather. The CPU emulation is a stand-in",
        parts={"04": ("linear_runs", "lstm_fails")}),
    Claim(
        "model-parallelism", "002",
        "It is crucial to remember that the model's parameters remain in the primary process's memory, while only "
        "copies are used on the worker GPUs, making it a form of model parallelism, while primarily data parallelism.",
        "two parts, from the replicas real nn.DataParallel makes on 2 GPUs: (1) primarily data parallelism: each "
        "batch's rows are split across the replicas; (2) a form of model parallelism: the model's layers or "
        "parameters are split across devices (each replica holds only part of them). (2) is what the sentence "
        "asserts: replicas that each hold every parameter show it wrong. The CPU emulation is a stand-in: it judges "
        "only itself, not what nn.DataParallel does",
        parts={"04": ("data_split", "model_split")}, decisive=("model_split",)),
    Claim(
        "custom-layer", "002",
        "DataParallel relies on all tensors being on the same device in the forward pass, and also in the backward "
        "pass when calculating the gradient, and the implementation of the CustomLayer is not guaranteed to transfer "
        "to the worker devices.",
        "holds if the article's CustomLayer (its weight an nn.Parameter) fails on a worker device under real "
        "nn.DataParallel; wrong if it runs on every replica. The CPU emulation is a stand-in",
        parts={"04": ("article_layer_fails",)}),
    Claim(
        "ddp-graceful", "002",
        "The DistributedDataParallel class generally handles the process of distributed data parallelism more "
        "gracefully, because it uses separate processes instead of threads, making the whole setup less prone to the "
        "limitations above mentioned.",
        "'generally' says how often, a frequency no run counts. (1) more gracefully: a comparison with "
        "nn.DataParallel on the same padded variable-length data: DDP trains it (bucketing, 2 gloo processes, "
        "ends ok) where real nn.DataParallel fails (the LSTM extension on 2 GPUs). DataParallel's side runs here "
        "only on the CPU emulation, a stand-in: then the comparison is not judged, whatever DDP's side did; "
        "(2) 'because it uses separate processes instead of threads': no run isolates the cause. The lab's own "
        "ragged all_gather (ddp-broken) is a mistake in the lab's code, not DDP's, and judges nothing",
        parts={"04": ("more_gracefully_than_dataparallel",)},
        unmeasured={"because_processes": "no run separates processes from threads as the cause"}),
    Claim(
        "dp-transfer-dominates", "002",
        "The transfer of data, model parameters, gradients, and loss across devices during forward and backward "
        "propagation can quickly dominate the training time, diminishing the overall speed benefits of `DataParallel`.",
        "holds if nn.DataParallel over 2 or more GPUs, large model and small batch, takes a step at least as long as "
        "the bare module on one GPU (no speed benefit left); DDP ranks on CPU are a stand-in",
        parts={"07": ("no_speed_benefit",)}),
    Claim(
        "dp-scaling", "002",
        "Lastly, `DataParallel` does not properly scale with increasing numbers of GPUs.",
        "holds if real nn.DataParallel runs at 2, 4 and 8 GPUs gain less per added GPU than DDP on the same GPUs; "
        "a traffic model fed with CPU numbers is a stand-in",
        parts={"07": ("scales_worse_than_ddp",)}),
    Claim(
        "device-affinity", "002",
        "this operation may not have correct device affinity in a distributed environment",
        "under real nn.DataParallel on >= 2 GPUs: holds if, in some replica, the article's torch.matmul(x, "
        "self.weight) meets an x and a self.weight on different devices (an error, or a weight left on GPU 0); "
        "wrong if every replica's weight is on its own input's device and the output equals one device's. The CPU "
        "emulation (the meta device for GPU 1) is a stand-in",
        parts={"10": ("weight_off_device",)}),

    # ---- article 003: Why is DistributedDataParallel timing out during initialization?
    Claim(
        "choose-a-port", "003",
        "os.environ['MASTER_PORT'] = '12355'  # Choose an available port",
        "holds if a port chosen by hand (free when chosen) serves every job that chose it: a job alone on it "
        "joins (its own run), and two jobs started at once on it both join (every pair)",
        parts={"05": ("alone_joins", "two_at_once_join")}),
    Claim(
        "sleep-lets-others-report", "003",
        "The `time.sleep` allows all processes to report errors before exiting, aiding in diagnosis.",
        "the article's time.sleep(60) after a failed init_process_group (PyTorch's default 30-minute timeout): "
        "(1) lab 05, on a taken port (rank 0's init fails at once and it sleeps): the other rank reports its own "
        "error within the sleep; (2) lab 06, Example 2 as written: a rank reports anything within the 60 s sleep; "
        "(3) lab 06, missing-rank with 3 s timeouts and a 2 s stay: a rank that stays alive after its own error lets "
        "errors that come within its stay reach the logs. (1) and (2) are the article's code: either shown false "
        "makes the sentence wrong",
        parts={"05": ("taken_port_peer_reports",), "06": ("errors_arrive_within_the_stay", "as_written_reports")},
        decisive=("taken_port_peer_reports", "as_written_reports")),
    Claim(
        "netstat-check", "003",
        "This code snippet illustrates a simple check using system commands (in this case, `netstat` on "
        "Linux/macOS; adapt to your OS) to verify the availability of the specified port.",
        "holds if the snippet, run as written, tells a taken port from a free one: 'Port check failed' while a "
        "listener holds the port and 'Port check successful' once it is free; wrong otherwise",
        parts={"05": ("tells_taken_from_free",)}),
    Claim(
        "timeout-at-these-steps", "003",
        "A timeout at this stage suggests a failure at one or more of these steps.",
        "two parts: (1) every initialization that failed here failed inside those steps (in init_process_group, "
        "while forming the process group, before any parameter was broadcast); (2) a timeout there means one of them "
        "failed: no run with nothing broken (only a rank arriving late, within what the job could wait for) timed out. "
        "'suggests' is a hint, not a rule: a late rank timing out under one short timeout does not refute it",
        parts={"06": ("failed_inside_these_steps", "only_when_a_step_failed")},
        hedged={"only_when_a_step_failed": "suggests"}),
    Claim(
        "firewall", "003",
        "Firewalls might be blocking the necessary ports used by the chosen communication backend (e.g., ports "
        "used by Gloo's TCP communication).",
        "lab 06: ranks whose packets to the master are dropped, as a firewall drops them, cannot initialize "
        "(init_process_group gives up on the store after its timeout), judged on dropped packets in a network "
        "namespace; loopback, where a closed port refuses at once, is a stand-in. Lab 09: with the rendezvous port "
        "open and the other ports closed, the job hangs in init_process_group with a rank's connection to the other "
        "node unanswered (SYN_SENT), and opening the cluster's subnet makes the same job finish",
        parts={"06": ("dropped_packets_stop_init",), "09": ("blocked_hangs_in_init", "opening_fixes")}),
    Claim(
        "env-inconsistent", "003",
        "Problems establishing the process group can stem from inconsistencies in the environment variables used "
        "across nodes or incorrect configuration of the communication backend.",
        "holds if ranks that disagree on an environment variable init reads cannot form the process group: "
        "lab 06 (one node): a rank with another MASTER_PORT, and a rank with another WORLD_SIZE, each make init "
        "fail; lab 09 (two nodes): nodes whose torchrun agents give their ranks different WORLD_SIZE (1 and 2 ranks "
        "a node with TORCH_ELASTIC_WORKER_IDENTICAL=1) stop the job in init_process_group, and the same uneven "
        "nodes launched without it (torchrun adds up the nodes' ranks) form the process group and finish",
        parts={"06": ("port_mismatch_fails", "world_size_mismatch_fails"),
               "09": ("world_size_disagreement_stops_init", "consistent_launch_forms_it")}),
    Claim(
        "versions-inconsistent", "003",
        "Inconsistent versions of PyTorch or the communication backend libraries across the distributed system "
        "are a common issue.",
        "a frequency (\"a common issue\") no run can count, about versions this machine cannot mix: lab 09's "
        "rank-side pre-flight compares every rank's torch, Python and NCCL versions before init_process_group, "
        "which a unit test on records checks, not a run",
        parts={}, shown_in=("09",),
        unmeasured={"mismatch_breaks_init": "one torch build (and no NCCL) is installed here, so ranks with two "
                                            "versions cannot be started on this machine"}),
    Claim(
        "slow-network-default", "003",
        "A slow or congested network can easily cause the initialization process to exceed the default timeout.",
        "holds if a slow or congested network delays init_process_group past PyTorch's default timeout (30 minutes "
        "for gloo); a rank arriving late on loopback is a stand-in for a slow network",
        parts={"06": ("exceeds_default",)}),
    Claim(
        "bandwidth-init", "003",
        "Furthermore, network latency and bandwidth limitations significantly impact initialization time.",
        "bandwidth: init_process_group (the slowest rank's own timing) takes at least twice as long at the lowest "
        "link cap as uncapped and at least 1 s longer (a difference a learner notices, above this shared machine's "
        "scheduling noise); latency: a link with added latency does the same",
        parts={"09": ("init_slower_at_low_bandwidth",)}, unmeasured={"latency": LATENCY}),
    Claim(
        "resource-limits-init", "003",
        "Beyond network considerations, resource limitations on individual nodes can also impede DDP "
        "initialization.",
        "a \"can\": holds if a resource limit on one node stops init_process_group and lifting it lets the same job "
        "initialize. Lab 06: the master's soft limit on open files (ulimit -n, set a few descriptors above what it "
        "has open) makes init_process_group fail on the master, and the same limit raised to the hard limit lets "
        "both ranks form the group and all-reduce. One limit shown is enough for a \"can\"; the article's next "
        "sentences (insufficient memory on the master, CPU taken by other processes) are not run and not judged here",
        parts={"06": ("fd_limit_stops_init", "raised_limit_initializes")}),
)
