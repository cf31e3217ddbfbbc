"""The one catalog of known failures: how to recognise each, what it means, which lab teaches it.

Text signatures match PyTorch's own messages, in a rank's exception record first and its log
after (the patterns are tested against messages captured from real runs, kept in ``tests/data/``).
Hang signatures are decided from where each rank stood when the job stopped making progress: each
carries its own rule (``hang_rule``, a predicate over ``ddplab.engine.classify.HangFacts``) and its
precedence; ``classify.hang_signature`` takes the first whose rule holds. Adding one is one entry
here and one captured example in ``tests/data``. This module is data and pure lookups only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ddplab.engine.causes import CAUSES, FROM_RECORDS, THREAD_EXCEPTION, Cause, UNUSED_PATTERNS, WORKER_EXCEPTION
from ddplab.engine.reasons import facts_from_text


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    patterns: tuple[str, ...]   # regexes (re.M); empty for stack signatures
    explanation: str            # two lines: what happened, what to do
    lab: str                    # the lab that teaches it ("01"); "" when none does
    hang_rule: Callable | None = None   # stack signatures: a predicate over classify.HangFacts
    precedence: int = 0                 # hang rules are tried lowest first
    premise: Callable | None = None     # text signatures: what the evidence must hold (reasons.FailureFacts)
    rules_out: Callable | None = None   # hang rules: facts (classify.HangFacts) under which the reading is wrong
    replaces: frozenset = frozenset()   # readings of the message this one is named over where its premise holds

    def search(self, text: str) -> re.Match | None:
        for p in self.patterns:
            m = re.search(p, text, re.M)
            if m:
                return m
        return None

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "patterns": list(self.patterns),
                "explanation": self.explanation, "lab": self.lab}  # (hang_rule: code, not data)


# Most specific first: the first entry whose pattern matches names the failure. The known user
# mistakes (ddplab.engine.causes, matched on exception type and key phrases) come before PyTorch's own.
CATALOG: tuple = CAUSES + FROM_RECORDS + (
    Signature(
        "port-in-use", "Rendezvous port already in use",
        (r"EADDRINUSE", r"[Aa]ddress already in use"),
        "Another process already listens on MASTER_PORT, so the store could not start.\n"
        "Pick a free port (ddplab run --port 0, torchrun --rdzv-endpoint 127.0.0.1:0) or stop the other job.",
        "05"),
    Signature(
        "gloo-loopback-address", "gloo's peer address is a loopback address (hostname resolves to 127.x)",
        (r"Gloo connectFullMesh failed with .*remote=\[127\.",),
        "gloo picked its address from the hostname, which resolves to 127.0.1.1 (Debian's /etc/hosts line), and told\n"
        "its peers to dial it; a peer on another machine dials its own loopback. Set GLOO_SOCKET_IFNAME to the cluster interface.",
        "09"),
    Signature(
        "missing-master-env", "MASTER_ADDR / MASTER_PORT not set",
        (r"environment variable (MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE) expected, but not set",),
        "init_process_group(init_method='env://') reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.\n"
        "Start the script with torchrun (it sets them all) or set them yourself before init_process_group.",
        "08"),
    Signature(
        "store-unreachable", "Cannot reach the master's store (MASTER_ADDR:MASTER_PORT)",
        (r"DistNetworkError: The client socket has (timed out after \d+ms while trying to connect|failed to connect)",
         r"TCP client failed to connect/validate to host \S+ - timed out"),
        "A rank never reached the rendezvous store at MASTER_ADDR:MASTER_PORT: wrong address or port, a firewall, or the master is down.\n"
        "Check the address and port every rank was given, and that the port is open on the master (ddplab doctor).",
        "06"),
    Signature(
        "rendezvous-timeout", "Ranks missing at rendezvous (store / rendezvous timeout)",
        (r"DistStoreError", r"RendezvousTimeoutError", r"[Ww]aiting for clients.*\d+/\d+ clients joined",
         r"Timed out after \d+ seconds waiting for clients", r"wait timeout after \d+ms, keys:",
         r"RendezvousClosedError", r"The node '.*' has failed to join the rendezvous"),
        "Not every rank reached init_process_group in time: a rank crashed, started late or cannot reach MASTER_ADDR:PORT.\n"
        "Check every rank's log for the first error; set the join timeout on purpose (init_process_group(timeout=...), --rdzv-conf join_timeout=...).",
        "06"),
    Signature(
        "collective-mismatch", "Ranks called different collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
        (r"Detected mismatch between collectives on ranks", r"[Mm]ismatch between collectives"),
        "The ranks reached a collective with a different operation, order or tensor shape.\n"
        "Make every rank call the same collectives in the same order with the same shapes; the message names both calls.",
        ""),
    Signature(
        "p2p-size-mismatch", "A point-to-point receive got a message of another size",
        (r"Received data size doesn't match expected size", r"op\.preamble\.length <= op\.nbytes"),
        "A dist.recv (or irecv) got a message whose size differs from its tensor's: the sender's tensor has another shape "
        "or dtype, or the pair's sends and receives are out of order.\n"
        "Make the receive buffer the sender's shape and dtype (send the shape first, or use send_object_list / "
        "recv_object_list), and pair each send with the recv meant for it (a tag per kind of message).",
        "", premise=lambda f: in_p2p_call(f.frames)),
    Signature(
        "gloo-size-mismatch", "Collective mismatch seen by gloo (received data size differs)",
        (r"Received data size doesn't match expected size", r"op\.preamble\.length <= op\.nbytes"),
        "Two ranks were in different collectives, or in the same one with tensors of different shapes or dtypes: gloo saw the bytes disagree.\n"
        "Find the collective one rank calls and the other does not (an `if rank == 0:`, a different number of batches), or print each rank's shape and dtype before it.",
        "03"),
    Signature(
        "ddp-model-mismatch", "DDP saw different models on different ranks",
        (r"DDP expects same model across all ranks", r"appears not to match sizes of the same param in process 0",
         r"expects same model across all ranks"),
        "DistributedDataParallel checks at construction that every rank has the same parameters; they differ.\n"
        "Build the model identically on every rank (no rank-dependent layer sizes); seed before building.",
        "03"),
    Signature(
        "unused-parameters-changed", "DDP: parameters that had gradients in earlier steps got none",
        UNUSED_PATTERNS,
        "This rank had already completed gradient all-reduces before the failing step: the parameters took part "
        "then, and the forward stopped using some of them (a branch on the step or the data, a layer skipped or frozen).\n"
        "Find the step where the forward path changes; if the change is meant, keep every parameter in the loss "
        "(add 0 * the skipped layer's output) or pass find_unused_parameters=True.",
        "", premise=lambda f: f.reduced_before > 0),
    Signature(
        "unused-parameters", "DDP: parameters that received no gradient",
        UNUSED_PATTERNS,
        "Some parameters took no part in producing the loss, so DDP's reducer waited for gradients that never came.\n"
        "Use every parameter in forward, or pass find_unused_parameters=True (costs a graph walk each step).",
        "10", premise=lambda f: f.reduced_before == 0),
    Signature(
        "device-mismatch", "Tensors on different devices in one operation",
        (r"Expected all tensors to be on the same device", r"is not on the expected device"),
        "An operation mixed tensors from two devices: a tensor created on a fixed device (or kept as a plain attribute) met a replica's input.\n"
        "Create tensors with device=x.device, or register_buffer them so DataParallel/.to() moves them with the module.",
        "04"),
    Signature(
        "tensor-size-mismatch", "Tensors of different sizes where equal sizes are required",
        (r"Sizes of tensors must match", r"size mismatch", r"[Tt]ensor.* must have the same (size|shape|number of elements)",
         r"[Mm]ismatch in tensor sizes", r"must match the size of tensor", r"shape '\[.*\]' is invalid for input of size",
         r"[Ii]nvalid .*(size|shape)", r"All tensors must have the same"),
        "A collective or a concatenation received tensors whose shapes differ across ranks or replicas.\n"
        "Gather sizes first and pad to the largest (or use all_gather_object); check shapes before the collective.",
        "04"),
    Signature(
        "cuda-oom", "CUDA out of memory",
        (r"CUDA out of memory", r"torch\.OutOfMemoryError", r"torch\.cuda\.OutOfMemoryError"),
        "A GPU allocation failed. On one rank it ends that rank; torchrun then ends the others.\n"
        "Lower the per-rank batch and keep the effective batch with gradient accumulation under no_sync().",
        ""),
    Signature(
        "cpu-oom", "CPU out of memory",
        (r"DefaultCPUAllocator: can't allocate memory", r"DefaultCPUAllocator: not enough memory",
         r"^MemoryError", r"std::bad_alloc", r"Cannot allocate memory"),
        "A host allocation failed (a memory limit or the machine's RAM). The failing rank exits; torchrun ends the rest.\n"
        "Lower the per-rank batch and keep the effective batch with gradient accumulation under no_sync().",
        "02"),
    Signature(
        "nccl-error", "NCCL error",
        (r"NCCL error", r"ncclInternalError", r"ncclUnhandledCudaError", r"ncclSystemError", r"ncclInvalidUsage",
         r"ProcessGroupNCCL.*(failed|error)", r"NCCL communicator was aborted"),
        "NCCL failed: a peer died, the network or NVLink/PCIe path failed, or NCCL and the driver disagree.\n"
        "Rerun with NCCL_DEBUG=INFO and read the first rank's NCCL WARN line; check every rank sees the same GPUs and versions.",
        ""),
    Signature(
        "collective-timeout", "A collective timed out",
        (r"Timed out waiting \d+ms for (recv|send) operation", r"Watchdog caught collective operation timeout",
         r"[Cc]ollective operation timeout", r"Timed out waiting \d+ms", r"Application timeout caused pair closure"),
        "A rank waited longer than the process group's timeout for the others to join a collective.\n"
        "The diagnosis names the rank it waited for and whether that rank was busy (a longer loop), blocked (another collective) or gone.",
        ""),
    Signature(
        "peer-lost", "A peer rank disappeared",
        (r"Connection reset by peer", r"Connection closed by peer", r"Broken pipe"),
        "This rank lost its connection to another rank: that rank ended first (the ranks' exits below say how).\n"
        "Read the first failure in torchrun's summary (Root Cause) and that rank's log.",
        ""),
    WORKER_EXCEPTION,
    THREAD_EXCEPTION,
    Signature(
        "python-exception", "A rank raised a Python exception",
        (r"^(?:\[rank\d+\]: )?(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt): .+",),
        "A rank stopped on an exception in the script's own code (not a known distributed failure).\n"
        "Read the traceback of the rank that failed first; the others were ended by torchrun.",
        ""),   # no lab teaches an arbitrary exception
)

GENERIC = {"peer-lost", "python-exception"}
# Entries that name no cause: the explanation says "cause not identified" and shows the evidence, with
# no fix and no lab.
UNIDENTIFIED = {"python-exception", "stalled-outside-collectives", "hang-same-collective"}

# Decided from where each rank stood (stacks, ledgers, exit records) when the job stopped making
# progress (ddplab.engine.classify.hang_signature).
def _waits_in_torch_distributed(f) -> bool:
    """A live rank waits in torch.distributed (a collective, a send or receive, the rendezvous): then the ranks'
    calls differ or one waits for a peer, and what keeps a rank alive at exit is not what keeps the job from
    ending."""
    return bool(f.in_coll or f.in_p2p or f.at_rendezvous)


STACK_CATALOG: tuple[Signature, ...] = (
    Signature(
        "hang-rank-exited", "A rank left while the others wait",
        (),
        "At least one rank had already finished while the others still waited in a collective.\n"
        "Every rank must make the same collective calls: give all ranks the same number of batches (DistributedSampler) or use Join.",
        "",
        # not when every rank that left had itself issued the collectives the others wait in
        hang_rule=lambda f: bool(f.gone and f.in_coll) and not f.gone_joined, precedence=40,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "rank-exited-early", "A rank finished while another still waited in a collective",
        (),
        "One rank left the loop early and exited cleanly; its peer was still in a collective, and gloo ended it with 'Connection closed by peer'.\n"
        "Every rank must make the same collective calls: give all ranks the same number of batches (DistributedSampler) or use Join.",
        ""),
    Signature(
        "timeout-too-short", "The process group's timeout ran out while a peer was still working",
        (),
        "This rank waited in a collective longer than the process group's timeout (set shorter than torch's default "
        "in init_process_group) while another rank was still running the script's own code, not stuck: its work "
        "(a checkpoint write, an evaluation on one rank) takes longer than the timeout.\n"
        "Give init_process_group a timeout longer than the longest work one rank does alone, or leave it at the "
        "default; where only one rank works, let the others wait for it after that work.",
        ""),
    Signature(
        "read-before-write", "A rank read a file that another rank was still writing",
        (),
        "This rank looked for a file that another rank writes (a download, a checkpoint, a cache) before that rank "
        "had written it: nothing made the readers wait for the writer.\n"
        "Put dist.barrier() between the write and the reads, called by every rank (the writer after writing, the "
        "readers before reading).",
        ""),
    Signature(
        "rank-killed", "A rank was killed from outside (SIGKILL) without a Python error",
        (),
        "A rank ended on SIGKILL and left no exception: something outside Python killed it (the kernel's OOM killer when a memory limit is reached, a scheduler, kill -9). Its peers then lost their connection.\n"
        "Look in the kernel log (dmesg: 'Out of memory: Killed process <pid>' or 'memory cgroup out of memory') and lower that rank's memory use, or raise the limit.",
        "02"),
    Signature(
        "hang-collective-while-handling", "A rank entered a collective while handling an exception",
        (),
        "A rank met an exception and, while handling it (an except or finally block, a with block's exit), entered a "
        "collective its peers are not in; they went on to other calls, so none can finish. The exception, shown below, "
        "is where it started.\n"
        "Fix what raised it; and let an exception end the rank (torchrun then ends the others) rather than sync in its "
        "handler, or have every rank agree first that one failed (all-reduce a flag) and leave together.",
        "",
        hang_rule=lambda f: bool(f.in_flight) and bool(f.in_coll), precedence=35),
    Signature(
        "new-group-on-some-ranks", "new_group called on some ranks only (or in another order)",
        (),
        "dist.new_group is itself collective over the whole job: every rank must call it, in the same order, "
        "even for a group it is not in. Here the ranks' calls part at a new_group (some ranks called it where the "
        "others did not), so each rank's next group is another one, and the ranks wait in group creation (or in "
        "the next collective) for each other.\n"
        "Call new_group on every rank, outside any condition on the rank (g = dist.new_group(ranks=[0]) on all "
        "ranks), and use the group only where the rank is in it.",
        "",
        # the ranks' own call records first part at a new_group and a live rank waits in new_group; not when an
        # exception was in flight at a collective a rank waits in
        hang_rule=lambda f: f.group_parted, precedence=28,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "non-daemon-thread", "A non-daemon thread keeps a rank alive after its script ended",
        (),
        "The rank's main thread finished the script, and Python waits at exit for every thread that is not a daemon: "
        "one of them (named below, with its line) never ends, so the rank never exits and torchrun waits for it.\n"
        "Make the thread end (a stop Event set before exit, then join it), or start it with daemon=True when it may "
        "be cut off at exit.",
        "",
        # a rank kept alive by its own thread; not when a live rank waits in torch.distributed (then the ranks'
        # calls differ, or one waits for a peer: the thread is not what keeps the job from ending)
        hang_rule=lambda f: any(r.where.kind == "thread" for r in f.kept_alive), precedence=45,
        rules_out=_waits_in_torch_distributed),
    Signature(
        "child-process-at-exit", "A child process keeps a rank from exiting",
        (),
        "The rank's main thread finished the script, and multiprocessing's exit handler joins every child process "
        "that is not a daemon: the one the rank started never ends, so the rank never exits and torchrun waits for it.\n"
        "End the child before the script ends (a stop Event or sentinel it watches, then join it), or start it with "
        "daemon=True when it may be terminated at exit.",
        "",
        # a rank whose stack at exit shows multiprocessing joining its child; not when a live rank waits in
        # torch.distributed (as for non-daemon-thread)
        hang_rule=lambda f: any(r.where.kind == "child" for r in f.kept_alive), precedence=46,
        rules_out=_waits_in_torch_distributed),
    Signature(
        "exception-in-collective", "A rank failed in a collective it called while an exception propagated",
        (),
        "A rank met an exception and, while handling it (an except or finally block, a with block's exit), called a "
        "collective the other ranks were not in: that call failed (gloo aborted it when the others' different call "
        "arrived, or lost its peer), and the first error was never printed. The exception, shown below, is where it started.\n"
        "Fix what raised it; and let an exception end the rank (torchrun then ends the others) rather than sync in its "
        "handler, or have every rank agree first that one failed (all-reduce a flag) and leave together.",
        "",
        # the first failing rank's last call record holds an exception in flight, and it failed inside that call
        premise=lambda f: f is not None and f.in_flight is not None,
        # what that collective met, as its own error says it: named over these, never over a cause of its own
        replaces=frozenset({"gloo-size-mismatch", "collective-mismatch", "tensor-size-mismatch", "collective-timeout",
                            "peer-lost", "python-exception", "p2p-size-mismatch"})),
    Signature(
        "hang-different-collectives", "Ranks wait in different collectives",
        (),
        "The ranks are blocked in different collectives (or at different collective numbers), and each needs every rank, so none can finish.\n"
        "Make the control flow the same on every rank: the same number of steps, no collective under `if rank == ...`.",
        "01",
        hang_rule=lambda f: bool(f.in_coll) and (len(f.ops) > 1 or f.divergence_kind == "different-op"), precedence=70,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "collective-root-differs", "Ranks wait in the same collective with different roots",
        (),
        "Every rank is blocked in the same collective, at the same call of its script, and the ranks named different "
        "roots for it (broadcast's src, reduce's or gather's dst; each rank's value is shown): each rank waits for "
        "a root the others do not serve, so none completes.\n"
        "Pass the same root on every rank: a constant (src=0), or a rank every rank computes alike (a group's first "
        "member, dist.get_global_rank(group, 0)), never the calling rank's own rank.",
        "",
        # the ranks' own call records at the collective they all block in (one op, one number) differ in the root;
        # not when an exception was in flight at it (then the call itself is the mistake)
        hang_rule=lambda f: f.args_differ is not None and f.args_differ.arg == "root", precedence=58,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "collective-group-differs", "Ranks wait in the same collective called in different process groups",
        (),
        "Every rank is blocked in the same collective, at the same call of its script, but the ranks passed different "
        "process groups (each rank's group members are shown; a group made with new_group is another group than the "
        "default one, even with the same members): each group's collective waits for ranks that called the other's, "
        "so none completes.\n"
        "Pass the same group on every rank (the same object every rank made with the same new_group call, or None "
        "for the default group on every rank).",
        "",
        # the ranks' own call records at the collective they all block in (one op, the same call number) differ in
        # the group; not when an exception was in flight at it. Precedence before hang-different-collectives: the
        # groups number their collectives apart, so the ledgers show different numbers, not different code paths
        hang_rule=lambda f: f.args_differ is not None and f.args_differ.arg == "group", precedence=57,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "hang-different-sizes", "Ranks wait in the same collective with different sizes",
        (),
        "The ranks reached the same collective with tensors of different sizes; it cannot complete (or fails later).\n"
        "Agree on sizes first (all-reduce MAX of the lengths, pad, then the collective) or use the *_object variants.",
        "",
        hang_rule=lambda f: bool(f.in_coll) and f.divergence_kind == "different-sizes", precedence=60,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "file-handshake-deadlock", "A rank polls for a file while the others wait for it in a collective",
        (),
        "A rank loops looking for a file that is not there (its looks and the path are shown) while every other rank "
        "waits in a collective it has not reached: a handshake through the file system crossed with one through "
        "torch.distributed. A rank that writes that file after the collective never gets there.\n"
        "Hand the values over through torch.distributed (dist.all_gather_object, or a dist.barrier() after every "
        "rank wrote its file, before any rank reads), or write the file before the collective the poller waits "
        "outside of.",
        "", hang_rule=lambda f: bool(f.polling), precedence=47,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "hang-rank-elsewhere", "A rank is not in any collective while the others wait",
        (),
        "Some ranks wait in a collective while another rank is elsewhere: sleeping, on a socket, a lock or its data loader.\n"
        "Look at what that rank is doing (its line is shown): it never reaches the collective the others wait in.",
        "",
        hang_rule=lambda f: bool(f.in_coll) and len(f.in_coll) < len(f.alive), precedence=50,
        rules_out=lambda f: bool(f.in_flight)),
    Signature(
        "hang-p2p-ordering", "Every rank blocked in a send (or every one in a receive) to a peer doing the same",
        (),
        "Blocking point-to-point calls pair a send with the peer's receive; here every rank sends first (or every rank "
        "receives first), so no send meets a receive and none completes: an ordering deadlock, not the network.\n"
        "Order each pair (even ranks send then receive, odd ranks receive then send), or post both at once with "
        "dist.isend / dist.irecv (or batch_isend_irecv) and wait on both.",
        "", hang_rule=lambda f: f.p2p_deadlock, precedence=35),
    Signature(
        "p2p-tag-mismatch", "A send and the receive waiting for it carry different tags",
        (),
        "A rank is blocked sending to a peer with one tag while that peer is blocked receiving from it with another "
        "(the ranks' blocked calls and their tags are shown): a send meets only a receive of the same peer and tag, "
        "so neither completes.\n"
        "Give each send the tag its receive expects (a tag per message kind: activations m, gradients 100 + m, on "
        "both sides), and post them in the same order on both ranks.",
        "", hang_rule=lambda f: bool(f.tag_mismatch), precedence=34),
    Signature(
        "hang-p2p", "A rank waits in a point-to-point send or receive",
        (),
        "A rank is blocked in dist.send / dist.recv: it waits for one peer to post the matching call (same peer, same tag), "
        "and that peer is elsewhere.\n"
        "Look at what its peer is doing (shown below): the matching recv/send is missing, comes later, or uses another tag.",
        "", hang_rule=lambda f: bool(f.in_p2p), precedence=55),
    Signature(
        "spawn-under-torchrun", "mp.spawn inside a script that torchrun already started",
        (),
        "Each process torchrun started calls mp.spawn and starts its own ranks: nproc x nprocs processes, each set with "
        "its own rank 0 and world size, all waiting for a rendezvous that cannot complete.\n"
        "Start a script that spawns with plain `python script.py`; to use torchrun, drop mp.spawn and read RANK, LOCAL_RANK "
        "and WORLD_SIZE from the environment (init_process_group() with no rank or world_size).",
        "", hang_rule=lambda f: bool(f.spawned), precedence=15),
    Signature(
        "hang-same-collective", "All ranks wait in the same collective",
        (),
        "Every rank is blocked in the same collective and none completes; nothing recorded says why (no rank is "
        "elsewhere, no sizes differ, no connection is refused).\n"
        "Read each rank's line and what it waited for below; no fix is given without evidence for one.",
        "",     # a symptom: the network's premise (an interface, a connection with no answer) is not shown to hold
        hang_rule=lambda f: bool(f.in_coll), precedence=80),
    Signature(
        "hang-data-port-blocked", "A rank's connection to another node gets no answer (a firewall drops it)",
        (),
        "A rank is stuck connecting (TCP SYN_SENT, no reply) to a port on another node: the store torchrun gives the workers\n"
        "(MASTER_PORT, a random port) or gloo's data port (also random). Open the cluster's own subnet between the nodes, not one port.",
        "09",
        hang_rule=lambda f: bool(f.blocked), precedence=20),
    Signature(
        "rendezvous-ranks-conflict", "The processes asked init_process_group for ranks that do not fit together",
        (),
        "Two processes asked for the same rank, or every process asked for a world of another size than the "
        "processes started: the rendezvous waits for a rank that no process will be.\n"
        "Under torchrun leave rank and world_size out of init_process_group (it reads RANK and WORLD_SIZE); if you pass "
        "them, take them from os.environ['RANK'] and os.environ['WORLD_SIZE'].",
        "06", hang_rule=lambda f: f.asks is not None and f.asks.conflict, precedence=25),
    Signature(
        "hang-rendezvous", "Ranks wait at rendezvous",
        (),
        "Some ranks are in init_process_group waiting for others that never arrive, or for a store that does not answer.\n"
        "Check that every rank starts, agrees on MASTER_ADDR:MASTER_PORT and WORLD_SIZE, and set a join timeout on purpose.",
        "05",
        hang_rule=lambda f: f.at_rendezvous and (not f.any_ledger or not f.in_coll), precedence=30),
    Signature(
        "stalled-outside-collectives", "No rank makes progress, and none is in a collective",
        (),
        "Every rank stopped outside torch.distributed: sleeping, waiting on a socket, a lock, a pipe or a subprocess.\n"
        "Read each rank's line: the wait is in the script's own code, not in a collective.",
        "",     # a symptom: no lab's premise (lab 05's retry loop) is shown to hold
        hang_rule=lambda f: True, precedence=90),
    Signature(
        "no-rank-started", "No rank started",
        (),
        "torchrun made no progress and started no rank.\n"
        "Run the script once by itself (python script.py) to see it import; check torchrun's output in the run directory.",
        "",
        hang_rule=lambda f: not f.alive, precedence=10),
    Signature(
        "deadline-exceeded", "Still making progress at the outer deadline",
        (),
        "The job was still working (using CPU, moving through collectives) when its outer limit ran out: slow, not stuck.\n"
        "Raise --deadline, or leave it out: a stuck job is found by the stall rule, not by the deadline.",
        ""),
    Signature(
        "rank-waits-for-data", "Stopped while a rank waited for its DataLoader and the others waited for it",
        (),
        "When the job was stopped (before ddplab saw it stall), a rank was fetching its next batch and its peers waited for it in a collective: a slow input pipeline looks like a hang.\n"
        "Measure the time in next(loader) per rank; more num_workers, cheaper decoding or balanced shards fix it (lab 11).",
        ""),
)

BY_ID = {s.id: s for s in CATALOG + STACK_CATALOG}
# The hang rules in the order they are tried.
HANG_RULES: tuple[Signature, ...] = tuple(sorted((s for s in STACK_CATALOG if s.hang_rule), key=lambda s: s.precedence))


def get(sig_id: str) -> Signature:
    return BY_ID[sig_id]


def in_p2p_call(frames) -> bool:
    """The failing rank raised inside a point-to-point call of torch.distributed (send, recv, ...)."""
    from ddplab.engine.stacks import P2P
    return any(f.func.rsplit(".", 1)[-1] in P2P and "torch/distributed" in f.file.replace("\\", "/") for f in frames)


def holds(sig, facts) -> bool:
    """Whether the evidence holds the entry's premise (an entry without one needs only its text)."""
    premise = getattr(sig, "premise", None)
    if premise is not None and not premise(facts):
        return False
    # a cause's own rules_out reads the same facts (a hang rule's reads HangFacts: hang_signature checks those)
    rules_out = sig.rules_out if isinstance(sig, Cause) else None
    return rules_out is None or not rules_out(facts)


# Named by classify.refine only where a peer's line holds the premise (a peer still working when the
# timeout ran out; a peer still writing the file the failing rank read).
REFINED = frozenset({"timeout-too-short", "read-before-write"})


def premised() -> set[str]:
    """The entries named only where the evidence holds a premise beyond the message's words, and the
    hang entries no lab teaches (their rule is their premise)."""
    return ({s.id for s in CATALOG if getattr(s, "premise", None) is not None}
            | {s.id for s in STACK_CATALOG if s.hang_rule is not None and not s.lab} | REFINED)


def match_text(text: str, facts=None) -> tuple[Signature, str] | None:
    """The first catalog entry whose pattern occurs in ``text`` and whose premise the evidence holds
    (``facts``: a reasons.FailureFacts, None when only the text is at hand), with the line that matched."""
    facts = facts if facts is not None else facts_from_text(text)
    for sig in CATALOG:
        if not holds(sig, facts):
            continue
        m = sig.search(text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return sig, text[start:end if end >= 0 else len(text)].strip()[:400]
    return None
