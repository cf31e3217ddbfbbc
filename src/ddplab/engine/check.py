"""``ddplab run --check``: after the run, compare what each rank recorded about itself (the rank hook's
``ranks/rankN.check.json``, written by ``_rankhook/ddplab_rankcheck.py`` with no collective added) and
return the findings as data: replicas that drifted apart, buffers that differ, samples seen twice or
never, the same order every epoch, the same inputs on every rank, optimizer steps inside ``no_sync()``,
unequal accumulation, a parameter with no gradient on some ranks, updates that bypassed the DDP wrapper,
optimizer steps that found no gradient at all, optimizers whose settings or loaded state differ across ranks,
a model trained in eval mode on some ranks, a strict=False load that matched nothing, an evaluation that counts
a DistributedSampler's padding or scores one rank's shard alone, IterableDataset workers that each yielded
every batch.

Each ``Finding`` names its kind, the ranks, the step or epoch, the object (a parameter, a buffer, a
DataLoader) and counts; the fix for each kind lives once, in ``FIXES`` (``ddplab.facts.CHECK_FIXES``). Sentences are made in
``ddplab.views.render_check``.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ddplab import runfiles
# the report's types and the fix for each kind live in ddplab.facts (below the engine, with the result types)
from ddplab.facts import CHECK_CAUSE_FIXES as CAUSE_FIXES  # noqa: F401  (re-exported)
from ddplab.facts import CHECK_FIXES as FIXES  # noqa: F401
from ddplab.facts import CHECK_KINDS as KINDS  # noqa: F401
from ddplab.facts import CheckReport, Finding, NotChecked

# Checksums of every DDP-wrapped model's parameters and buffers every EVERY-th forward with grad (and
# at construction and at the end). benchmarks/check_overhead.py measures the cost on lab 07's step:
# one checksum is about 4 % of that step, so every 10th forward costs 0.4 %.
EVERY = 10
ENV = "DDPLAB_CHECK"


def read(run_dir: str | Path, world: int) -> dict[int, dict]:
    out = {}
    for r in range(world):
        p = Path(runfiles.rank_path(run_dir, r, runfiles.CHECK))
        if p.exists():
            try:
                out[r] = json.loads(p.read_text())
            except ValueError:
                pass
    return out


def has_records(run_dir: str | Path) -> bool:
    """Whether any rank left --check records in the folder (a job started with --check, or a node's
    folder saved from one)."""
    return any(runfiles.rank_of(p.name, runfiles.CHECK) is not None
               for p in (Path(run_dir) / runfiles.RANKS).glob("rank*"))


def not_ended(report: "CheckReport", ranks) -> "CheckReport":
    """No rank left check records, but a rank's own evidence shows it had imported torch (a collective in
    its ledger, torch's worker server answering, torch in its stack): the ranks never reached their exit,
    where the records are written (a hung job the launcher ended), so "nothing" says that instead."""
    def torch_seen(r) -> bool:
        return bool(r.ledger) or r.stack_source == "worker-server" or any(
            "torch" in Path(f.file).parts for f in r.stack)
    if report is not None and report.nothing == "no-records" and any(torch_seen(r) for r in ranks):
        return replace(report, nothing="not-ended")
    return report


def compare(run_dir: str | Path, world: int, every: int = EVERY) -> CheckReport:
    """The findings of one run, from its ranks' records."""
    return compare_records(read(run_dir, world), every)


def compare_records(recs: dict[int, dict], every: int = EVERY) -> CheckReport:
    ranks = tuple(sorted(recs))
    if not recs:
        return CheckReport(every, nothing="no-records")
    every = next(iter(recs.values())).get("every", every)
    if not any(r.get("process_group") for r in recs.values()):
        return CheckReport(every, nothing="no-process-group", ranks=ranks)
    findings: list[Finding] = []
    not_checked: list[NotChecked] = []
    fsdp = sorted({k for r in recs.values() for k in r.get("fsdp", ())})
    if fsdp:
        not_checked.append(NotChecked("replicas", "fsdp", tuple(r for r in ranks if recs[r].get("fsdp")),
                                      ", ".join(fsdp)))
    matched = _matched_optimizers(recs, ranks)
    counts = {r: len(recs[r].get("models", ())) for r in ranks}
    n_models = min(counts.values())
    compared = 0
    if n_models == 0 and not fsdp:
        own, apart, compared = _compare_unwrapped(recs, ranks, matched)
        findings += own
        not_checked += apart
        if not compared:
            unwrapped = tuple(r for r in ranks if recs[r].get("unwrapped_steps"))
            not_checked.append(NotChecked("replicas", "no-ddp-model", unwrapped or ranks,
                                          "optimizer steps on parameters no DDP wrapper holds" if unwrapped else ""))
    checksums = 0
    for i in range(n_models):
        models = {r: recs[r]["models"][i] for r in ranks}
        fs, n = _compare_model(models)
        findings += fs
        checksums += n
        findings += _compare_modes(models)
    findings += _loads_that_matched_little(recs, ranks)
    steps = {r: recs[r].get("steps", 0) for r in ranks}
    if all(steps.values()) and all(recs[r].get("gradless_steps") == steps[r] for r in ranks):
        # every optimizer step on every rank found no gradient on any of its parameters: nothing trained
        findings.append(Finding("steps-without-gradients", ranks, "optimizer.step()", step=0,
                                count=max(steps.values()), of=max(steps.values())))
    findings += _compare_fsdp_wraps(recs, ranks)
    optim = _compare_optimizers(ranks, matched)
    if optim:
        # replicas that were equal until the optimizers' settings or state parted: that finding seen from the
        # parameters, and its fix (steps outside the wrapper, weights loaded after it) is not this one's
        first = min(f.step for f in optim)
        findings = [f for f in findings if not (f.kind == "replicas-differ" and (f.step or 0) >= first)]
    findings += optim
    data, epochs = _compare_loaders(recs, ranks)
    if any(f.kind == "samples-overlap" for f in data):
        # the loader's own records already say which samples every rank shared: the inputs that were the
        # same on every rank are that finding seen from the model, not a second problem
        findings = [f for f in findings if f.kind != "same-inputs"]
    findings += data
    findings += _compare_eval_loaders(recs, ranks)
    findings += _worker_duplicates(recs, ranks)
    findings += _collective_args(recs, ranks)
    if n_models and not epochs and not any(f.kind.startswith("samples") for f in findings):
        streamed = tuple(r for r in ranks for rec in recs[r].get("loaders", ()) if rec.get("iterable") and any(
            ep["forwards_end"] > ep["forwards_start"] for ep in rec["epochs"]))
        if streamed:
            # an IterableDataset hands out no indices: which samples each rank saw is not known
            not_checked.append(NotChecked("data", "iterable-loader", tuple(sorted(set(streamed)))))
        elif any(recs[r].get("loaders") for r in ranks):
            not_checked.append(NotChecked("data", "no-training-loader", ranks,
                                          "no DataLoader epoch fed a DDP or FSDP forward with gradients"))
    return CheckReport(every, tuple(findings), tuple(not_checked), None, ranks, n_models, checksums, epochs, compared)


def _first_diff(lists: dict[int, list], names: list[str]) -> tuple[tuple[int, ...], str | None, int]:
    """(ranks whose list differs from rank 0's, the first differing name, how many entries differ)."""
    base = lists[min(lists)]
    odd = tuple(r for r, v in sorted(lists.items()) if v != base)
    if not odd:
        return (), None, 0
    diff = [j for j in range(len(base)) if any(j >= len(v) or v[j] != base[j] for v in lists.values())]
    name = names[diff[0]] if diff and diff[0] < len(names) else None
    return odd, name, len(diff)


def _compare_model(models: dict[int, dict]) -> tuple[list[Finding], int]:
    out: list[Finding] = []
    r0 = min(models)
    names, bnames = models[r0]["names"], models[r0]["buffer_names"]
    label = lambda n: n or "?"
    # checkpoints aligned by (kind, forwards with grad): the same point of training on every rank
    keyed = {r: {(c["kind"], c["fwd"]): c for c in m["checkpoints"]} for r, m in models.items()}
    common = sorted(set.intersection(*(set(k) for k in keyed.values())), key=lambda k: (k[0] != "construct", k[1]))
    param_found = None
    last_equal = None
    for key in common:
        cps = {r: keyed[r][key] for r in models}
        odd, name, n = _first_diff({r: c["params"] for r, c in cps.items()}, names)
        if odd and param_found is None:
            param_found = Finding("replicas-differ", odd, label(name), step=cps[r0]["step"], count=n, of=len(names),
                                  since_equal=last_equal)
        elif not odd and param_found is None:
            last_equal = cps[r0]["step"]
    finals = {r: m.get("final") for r, m in models.items()}
    same_end = all(finals.values()) and len({f["step"] for f in finals.values()}) == 1
    # buffers at every aligned checkpoint that holds them: the forwards DDP synced before, and the end only
    # where DDP never syncs them (broadcast_buffers=False: the hook then sums them in the final checkpoint)
    unsynced = not any(m.get("sync_buffers", True) for m in models.values())
    points = [{r: keyed[r][key] for r in models} for key in common] + ([finals] if same_end and unsynced else [])
    buf_found = None
    for cps in points:
        if all("buffers" in c for c in cps.values()):
            odd_b, bname, nb = _first_diff({r: c["buffers"] for r, c in cps.items()}, bnames)
            if odd_b:
                buf_found = Finding("buffers-differ", odd_b, label(bname), step=cps[r0]["step"], count=nb,
                                    of=len(bnames))
                break
    if param_found is None and same_end:
        odd, name, n = _first_diff({r: f["params"] for r, f in finals.items()}, names)
        if odd:
            param_found = Finding("replicas-differ", odd, label(name), step=finals[r0]["step"], count=n,
                                  of=len(names), since_equal=last_equal)
    out += [f for f in (param_found, buf_found, _same_inputs(keyed, common, r0)) if f is not None]
    steps = {r: m["steps"] for r, m in models.items()}
    for kind, key in (("step-in-no-sync", "unsynced_steps"), ("update-outside-ddp", "bypass_steps")):
        did = {r: m[key] for r, m in models.items() if m.get(key)}
        if did:
            first = min(v[0] for v in did.values())
            out.append(Finding(kind, tuple(sorted(did)), "optimizer.step()", step=first,
                               count=max(len(v) for v in did.values()), of=max(steps[r] for r in did)))
    accum = {r: m["accum"] for r, m in models.items()}
    n = min(len(v) for v in accum.values())
    at = next((j for j in range(n) if len({v[j] for v in accum.values()}) > 1), None)
    if at is not None:
        base = accum[r0][at]
        out.append(Finding("unequal-accumulation", tuple(r for r, v in sorted(accum.items()) if v[at] != base),
                           "forwards per optimizer step", step=at,
                           count=sum(1 for j in range(n) if len({v[j] for v in accum.values()}) > 1), of=n))
    missing = {r: m["no_grad"] for r, m in models.items()}
    for name in names:
        per = {r: missing[r].get(name) for r in models}
        if len({(v or [None, 0])[1] for v in per.values()}) > 1:
            rs = tuple(r for r, v in sorted(per.items()) if v)
            out.append(Finding("grad-missing", rs, name, step=min(v[0] for v in per.values() if v),
                               count=max(v[1] for v in per.values() if v), of=max(steps.values())))
            break
    return out, len(common)


def _same_inputs(keyed: dict, common: list, r0: int) -> Finding | None:
    """Every rank gave the model bit-identical inputs at every checked forward (at least two), and the
    inputs changed from one checked forward to the next (data flowing, not a constant stand-in): the
    ranks trained on the same data. A fixed tensor fed to every rank names nothing."""
    fwd = [k for k in common if k[0] == "forward" and all(keyed[r][k].get("inputs") for r in keyed)]
    if len(fwd) < 2:
        return None
    if any(len({tuple(keyed[r][k]["inputs"]) for r in keyed}) > 1 for k in fwd):
        return None
    if len({tuple(keyed[r0][k]["inputs"]) for k in fwd}) < 2:
        return None
    return Finding("same-inputs", tuple(sorted(keyed)), "the DDP model's inputs", step=keyed[r0][fwd[0]]["step"],
                   count=len(fwd), of=len(fwd))


def _compare_fsdp_wraps(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[Finding]:
    """FSDP (FSDP1) shards a model each rank built itself; without sync_module_states it assumes they
    were equal. The i-th outermost wrap of every rank, compared: their parameters' checksums before
    sharding differ, nothing synced them, and every rank trained from them (its first forward with
    gradients found no parameter written since the wrap: no checkpoint loaded over them)."""
    out = []
    n = min(len(recs[r].get("fsdp_wraps", ())) for r in ranks) if len(ranks) > 1 else 0
    for i in range(n):
        wraps = {r: recs[r]["fsdp_wraps"][i] for r in ranks}
        if any(w.get("sum") is None or w.get("sync_module_states") or w.get("written_before_training") is not False
               for w in wraps.values()):
            continue
        base = wraps[ranks[0]]["sum"]
        odd = tuple(r for r in ranks if wraps[r]["sum"] != base)
        if odd:
            out.append(Finding("init-differs", odd, f"FSDP-wrapped model #{i}", step=0))
    return out


def _setting_at(hp: list, step: int):
    """An optimizer's param groups' numbers in force at ``step`` (the last change at or before it)."""
    cur = None
    for at, groups in hp:
        if at > step:
            break
        cur = groups
    return cur


# the settings named first where several differ: what a learner sets; then the rest, by name
_SETTINGS_FIRST = ("lr", "momentum", "betas", "weight_decay", "eps", "alpha", "dampening")


def _first_setting_diff(vals: dict[int, list]) -> tuple[str, dict]:
    """The first param group and setting whose value differs across ranks: (label, {rank: value})."""
    for j in range(max(len(v or ()) for v in vals.values())):
        keys = {k for v in vals.values() if v and j < len(v) for k in v[j]}
        for k in sorted(keys, key=lambda k: (_SETTINGS_FIRST.index(k) if k in _SETTINGS_FIRST
                                             else len(_SETTINGS_FIRST), k)):
            per = {r: (v[j].get(k) if v and j < len(v) else None) for r, v in vals.items()}
            if len({repr(x) for x in per.values()}) > 1:
                return f"param group {j}: {k}", per
    return "param groups", {r: None for r in vals}


def _optimizer_key(o: dict) -> tuple:
    return (o["type"], tuple(o.get("sizes", ())), tuple(o.get("models", ())), o.get("shapes"))


def _matched_optimizers(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[dict[int, dict]]:
    """The optimizers every rank has, matched by what they optimize (type, parameters per group, the DDP
    models holding them) and, among equals, by order; one a rank alone made (to write a checkpoint) is
    left out."""
    per = {}
    for r in ranks:
        seen: dict = {}
        for o in recs[r].get("optimizers", ()):
            k = _optimizer_key(o)
            per.setdefault((k, seen.get(k, 0)), {})[r] = o
            seen[k] = seen.get(k, 0) + 1
    return [v for _, v in sorted(per.items(), key=lambda kv: min(o["index"] for o in kv[1].values()))
            if len(v) == len(ranks)]


def _compare_unwrapped(recs: dict[int, dict], ranks: tuple[int, ...],
                       matched: list[dict[int, dict]]) -> tuple[list[Finding], list[NotChecked], int]:
    """No DDP or FSDP model on any rank: the parameters of each optimizer every rank has, over parameters no
    wrapper holds (the same shapes on every rank), compared at its first step and at the end. Equal at the first
    and different at the end, with no rank sending point to point (a pipeline's stages differ by design):
    each rank trained a model of its own. Different from the first step: said, not named (findings, what was
    not judged, optimizers compared)"""
    if len(ranks) < 2 or any(recs[r].get("p2p") is not False for r in ranks):
        return [], [], 0
    out, apart, compared = [], [], 0
    for i, opts in enumerate(matched):
        if any(o.get("models") for o in opts.values()):
            continue
        sums = {r: o.get("param_sums") or [] for r, o in opts.items()}
        if any(len(v) < 2 for v in sums.values()):
            continue
        first = {r: v[0] for r, v in sums.items()}
        last = {r: v[-1] for r, v in sums.items()}
        if len({v[0] for v in last.values()}) != 1:
            continue
        compared += 1
        if len({tuple(v) for v in first.values()}) != 1:
            # apart from the start: shards that differ by design (tensor parallel), or ranks that each built a
            # model nothing syncs; the evidence does not tell which, so it is shown, not named
            o0 = opts[ranks[0]]
            apart.append(NotChecked("replicas", "own-models-apart", ranks, f"{o0['type']} (optimizer #{i})"))
            continue
        if None not in {v[1] for v in last.values()} and len({v[1] for v in last.values()}) > 1:
            o0 = opts[ranks[0]]
            out.append(Finding("model-not-wrapped", ranks, f"{o0['type']} (optimizer #{i})",
                               step=last[ranks[0]][0], count=sum(o0.get("sizes", ()))))
    return out, apart, compared


def _compare_optimizers(ranks: tuple[int, ...], matched: list[dict[int, dict]]) -> list[Finding]:
    """Each optimizer every rank has (``_matched_optimizers``) compared across ranks: its hyperparameters at
    every step where some rank's changed, up to the steps every rank took; where none differ, its state's
    checksum at steps every rank summed it, when only some ranks loaded a state. DDP averages gradients;
    what each rank's optimizer does with them is its own."""
    if len(ranks) < 2:
        return []
    out = []
    for i, opts in enumerate(matched):
        kind_name = f"{opts[ranks[0]]['type']} (optimizer #{i})"
        loads = {r: tuple(o.get("loads", ())) for r, o in opts.items()}
        asymmetric = len(set(loads.values())) > 1
        loaded = tuple(r for r in ranks if loads[r])
        common = min(o["steps"] for o in opts.values())
        # a truncated record holds its changes up to its last entry only
        upto = min([common] + [o["hp"][-1][0] for o in opts.values() if o.get("truncated") and o["hp"]])
        points = sorted({at for o in opts.values() for at, _ in o.get("hp", ()) if at < upto})
        prev = None
        for at in points:
            vals = {r: _setting_at(o["hp"], at) for r, o in opts.items()}
            if len({repr(v) for v in vals.values()}) == 1:
                prev = vals[ranks[0]]
                continue
            name, per = _first_setting_diff(vals)
            state = asymmetric and any(x <= at for r in loaded for x in loads[r])
            if prev is not None:
                odd = tuple(r for r in ranks if vals[r] != prev)
            elif state:
                odd = loaded
            else:
                odd = tuple(r for r in ranks if vals[r] != vals[ranks[0]])
            out.append(Finding("optimizer-state-differs" if state else "hyperparameter-differs", odd,
                               f"{kind_name}, {name}", step=at, values=tuple((r, per[r]) for r in ranks),
                               loaded=loaded if state else None))
            break
        else:
            if asymmetric and loaded:
                sums = {r: {at: v for at, v in o.get("state_sums", ())} for r, o in opts.items()}
                for at in sorted(set.intersection(*(set(v) for v in sums.values()))):
                    if at < common and len({sums[r][at] for r in ranks}) > 1:
                        out.append(Finding("optimizer-state-differs", loaded, f"state of {kind_name}", step=at,
                                           loaded=loaded))
                        break
    return out


def _loader_key(rec: dict) -> tuple:
    return (rec["dataset"], rec["size"])


def _loader_name(rec: dict) -> str:
    """The loader a finding is about, as the hook recorded it: its dataset, size, Subset, sampler."""
    return f"DataLoader over {rec['dataset']}[{rec['size']}]" + (" (a Subset)" if rec["subset"] else "") + \
        f", {rec['sampler']}"


def _compare_loaders(recs: dict[int, dict], ranks: tuple[int, ...]) -> tuple[list[Finding], int]:
    """Training epochs (those during which the rank ran a DDP or FSDP forward with grad), per loader,
    loaders matched across ranks by their underlying dataset (type and size) and order."""
    per_rank: dict[int, dict[tuple, list[tuple[dict, dict]]]] = {}
    for r in ranks:
        by: dict[tuple, list] = {}
        for rec in recs[r].get("loaders", ()):
            train = [ep for ep in rec["epochs"] if ep["forwards_end"] > ep["forwards_start"] and ep["indices"]]
            if train:
                by.setdefault(_loader_key(rec), []).append((rec, train))
        per_rank[r] = by
    out: list[Finding] = []
    compared = 0
    keys = set.intersection(*(set(b) for b in per_rank.values())) if per_rank else set()
    for key in sorted(keys, key=str):
        for j in range(min(len(per_rank[r][key]) for r in ranks)):
            loaders = {r: per_rank[r][key][j] for r in ranks}
            rec0 = loaders[ranks[0]][0]
            what = _loader_name(rec0)
            # the same order every epoch, on a sampler that shuffles
            for r in ranks:
                rec, eps = loaders[r]
                if not rec["shuffle"]:
                    continue
                done = [ep for ep in eps if ep["complete"] and not ep["truncated"]]
                rep = next((e for e in range(1, len(done)) if done[e]["indices"] == done[0]["indices"]), None)
                if rep is not None:
                    same = [r2 for r2 in ranks if _repeats(loaders[r2])]
                    out.append(Finding("same-order", tuple(same), what, epoch=rep,
                                       count=sum(1 for e in done[1:] if e["indices"] == done[0]["indices"]),
                                       of=len(done)))
                    break
            # overlap and samples never seen, epoch by epoch
            n_ep = min(len(loaders[r][1]) for r in ranks)
            over_found = drop_found = None
            for e in range(n_ep):
                eps = {r: loaders[r][1][e] for r in ranks}
                if any(ep["truncated"] for ep in eps.values()):
                    continue
                compared += 1
                sets = {r: set(ep["indices"]) for r, ep in eps.items()}
                seen: dict[int, int] = {}
                for s in sets.values():
                    for i in s:
                        seen[i] = seen.get(i, 0) + 1
                twice = sum(1 for c in seen.values() if c > 1)
                # the same Subset on every rank (a train/validation split): its indices are the epoch's
                # whole; Subsets that differ by rank: the dataset under them is
                same_split = len({loaders[r][0].get("subset_digest") for r in ranks}) == 1
                size = (rec0.get("length") if same_split else rec0["size"]) or 0
                world = len(ranks)
                pad = (-size) % world if rec0["distributed"] and not rec0["drop_last"] else 0
                drop = size % world if rec0["distributed"] and rec0["drop_last"] else 0
                if rec0.get("loader_drop_last") and rec0.get("batch_size"):
                    drop += world * (rec0["batch_size"] - 1)     # each rank's last incomplete batch
                # Subsets that differ by rank under a DistributedSampler: each rank split the data its own
                # way (random_split without a shared generator); the samples a split holds out are by design
                split_differs = not same_split and rec0.get("subset") and rec0["distributed"]
                cause = "split-differs" if split_differs else None
                held = max(size - (rec0.get("length") or size), 0) if split_differs else 0
                if twice > pad and over_found is None:
                    shared = tuple(r for r in ranks if any(seen[i] > 1 for i in sets[r]))
                    over_found = Finding("samples-overlap", shared, what, epoch=e, count=twice, of=size, cause=cause)
                never = size - len(seen) - held   # seen lies inside the shared Subset, or the whole dataset
                if all(ep["complete"] for ep in eps.values()) and never > drop and drop_found is None and size:
                    drop_found = Finding("samples-dropped", ranks, what, epoch=e, count=never, of=size, cause=cause,
                                         held_out=held or None)
            out += [f for f in (over_found, drop_found) if f is not None]
    return out, compared


def _repeats(loader: tuple[dict, list]) -> bool:
    rec, eps = loader
    done = [ep for ep in eps if ep["complete"] and not ep["truncated"]]
    return rec["shuffle"] and any(done[e]["indices"] == done[0]["indices"] for e in range(1, len(done)))


def _mode_at(modes: list, fwd: int):
    """The modes in force at the ``fwd``-th forward with grad (the last record at or before it)."""
    cur = None
    for at, _, m in modes:
        if at > fwd:
            break
        cur = m
    return cur


def _compare_modes(models: dict[int, dict]) -> list[Finding]:
    """The wrapped model's train/eval modes at each forward with grad through DDP, compared across ranks up to
    the forwards every rank ran: a rank that trained with modules in eval mode (BatchNorm's running statistics,
    no dropout) where another had them in train mode. The same modes on every rank (eval on purpose, frozen
    BatchNorm) name nothing; forwards without grad (an evaluation) are not recorded."""
    if len(models) < 2 or any(not m.get("modes") for m in models.values()):
        return []
    common = min(m["forwards"] for m in models.values())
    points = sorted({at for m in models.values() for at, _, _ in m["modes"] if at <= common})
    found = None
    differing = 0
    for j, at in enumerate(points):
        vals = {r: _mode_at(m["modes"], at) for r, m in models.items()}
        if any(v is None for v in vals.values()) or len({repr(v) for v in vals.values()}) == 1:
            continue
        end = points[j + 1] if j + 1 < len(points) else common + 1
        differing += end - at
        if found is None:
            low = min(v["eval"] for v in vals.values())
            odd = tuple(r for r in sorted(vals) if vals[r]["eval"] > low)
            if not odd:      # as many modules in eval mode everywhere, but not the same ones
                r0 = min(vals)
                odd = tuple(r for r in sorted(vals) if repr(vals[r]) != repr(vals[r0]))
            others = {tuple(n) for r in vals if r not in odd for n in vals[r]["names"]}
            mine = [n for n in vals[odd[0]]["names"] if tuple(n) not in others]
            first = next((n for n in mine if n[0]), mine[0] if mine else None)   # a submodule before the root
            step = next(s for a, s, _ in reversed(models[odd[0]]["modes"]) if a <= at)
            found = (odd, first, step, vals[odd[0]]["eval"], vals[odd[0]]["of"])
    if found is None:
        return []
    odd, first, step, n_eval, of = found
    what = (f"{first[1]} {first[0]}" if first[0] else f"{first[1]} (the wrapped module)") if first else "modules"
    return [Finding("mode-differs", odd, what, step=step, count=differing, of=common, modules=n_eval,
                    modules_of=of)]


def _loads_that_matched_little(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[Finding]:
    """``Module.load_state_dict(..., strict=False)`` calls that left at least half of the module's parameters
    missing while keys of the given state dict matched nothing: a checkpoint loaded under other names (a
    "module." prefix), so the model kept the weights it had. A strict load raises instead (not recorded); a
    partial load whose given keys all matched (an adapter, a new head) names nothing."""
    hits: dict[tuple, dict[int, dict]] = {}
    for r in ranks:
        for ld in recs[r].get("module_loads", ()):
            if ld["params"] and ld["unexpected"] and ld["params_missing"] * 2 >= ld["params"]:
                hits.setdefault((ld["type"], ld["params"]), {}).setdefault(r, ld)
    out = []
    for (type_, _), per in hits.items():
        ld = per[min(per)]
        cause = {"checkpoint": "key-prefix-in-checkpoint", "model": "key-prefix-in-model"}.get(ld.get("prefix_on"))
        out.append(Finding("load-keys-missing", tuple(sorted(per)), f"{type_}.load_state_dict(..., strict=False)",
                           step=ld["steps"], count=ld["params_missing"], of=ld["params"], cause=cause,
                           prefix=ld.get("prefix"), unexpected=ld["unexpected"]))
    return out


def _eval_epochs(rec: dict) -> list[dict]:
    """A loader's evaluation epochs: every batch drawn with gradients off, no DDP or FSDP forward with
    gradients while it ran, and indices recorded (an old record without the grad field has none)."""
    return [ep for ep in rec["epochs"] if ep.get("grad") is False and ep["forwards_end"] == ep["forwards_start"]
            and ep["indices"]]


def _compare_eval_loaders(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[Finding]:
    """Loaders iterated for evaluation (``_eval_epochs``) in a job that trained through DDP or FSDP, matched
    across ranks by dataset (type, size) and order. A DistributedSampler that pads the data to a multiple of
    the world size gives the padding samples twice: the ranks' evaluation together saw them twice
    (``eval-padding-repeats``). A DistributedSampler's share iterated on some ranks while the others
    evaluated nothing over that dataset: those ranks scored a shard alone (``eval-one-shard``)."""
    if len(ranks) < 2 or not all(recs[r].get("train_forwards") for r in ranks):
        return []
    per_rank: dict[int, dict[tuple, list]] = {}
    for r in ranks:
        by: dict[tuple, list] = {}
        for rec in recs[r].get("loaders", ()):
            eps = _eval_epochs(rec)
            if eps:
                by.setdefault(_loader_key(rec), []).extend((rec, ep) for ep in eps)
        per_rank[r] = by
    out: list[Finding] = []
    keys = sorted({k for b in per_rank.values() for k in b}, key=str)
    world = len(ranks)
    for key in keys:
        have = tuple(r for r in ranks if key in per_rank[r])
        rec0 = per_rank[have[0]][key][0][0]
        what = _loader_name(rec0)
        if len(have) < world:
            # a shard scored on some ranks alone: complete epochs of a DistributedSampler that gave them part
            # of the data, where the other ranks had no loader over that dataset at all
            if any(_loader_key(rc) == key for r in ranks if r not in have for rc in recs[r].get("loaders", ())):
                continue
            alone = []
            for r in have:
                rec, ep = next(((rc, e) for rc, e in per_rank[r][key] if rc["distributed"] and e["complete"]
                                and not e["truncated"] and (rc.get("num_replicas") or 1) > 1), (None, None))
                whole = (rec.get("length") or rec.get("size") or 0) if rec else 0
                if rec is not None and len(set(ep["indices"])) < whole:
                    alone.append((r, len(set(ep["indices"])), whole))
            if alone:
                out.append(Finding("eval-one-shard", tuple(r for r, _, _ in alone), what,
                                   count=alone[0][1], of=alone[0][2]))
            continue
        for j in range(min(len(per_rank[r][key]) for r in ranks)):
            pair = {r: per_rank[r][key][j] for r in ranks}
            if not all(rc["distributed"] and not rc["drop_last"] and rc.get("num_replicas") == world
                       and ep["complete"] and not ep["truncated"] for rc, ep in pair.values()):
                continue
            if len({rc.get("subset_digest") for rc, _ in pair.values()}) > 1:
                continue
            size = rec0.get("length") or 0
            pad = (-size) % world
            seen: dict[int, int] = {}
            for _, ep in pair.values():
                for i in set(ep["indices"]):
                    seen[i] = seen.get(i, 0) + 1
            twice = sum(c - 1 for c in seen.values() if c > 1)
            if 0 < twice <= pad and len(seen) == size:
                shared = tuple(r for r in ranks if any(seen[i] > 1 for i in pair[r][1]["indices"]))
                out.append(Finding("eval-padding-repeats", shared, what, epoch=j, count=twice, of=size))
                break
    return out


def _worker_duplicates(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[Finding]:
    """An IterableDataset read by W > 1 DataLoader workers whose complete epoch gave every batch exactly W
    times (bit-identical checksums), with at least two different batches (data flowing, not a constant): each
    worker iterated the whole dataset, none its own share (torch.utils.data.get_worker_info). One worker, a
    map-style dataset (the sampler shares the indices out), or batches that differ name nothing."""
    hits: dict[tuple, dict[int, tuple]] = {}
    for r in ranks:
        for rec in recs[r].get("loaders", ()):
            w = rec.get("num_workers") or 0
            if not rec.get("iterable") or w < 2:
                continue
            for e, ep in enumerate(rec["epochs"]):
                sums = ep.get("batch_sums") or []
                if not ep["complete"] or ep.get("sums_truncated"):
                    continue
                counts: dict[int, int] = {}
                for v in sums:
                    counts[v] = counts.get(v, 0) + 1
                if len(counts) >= 2 and all(c == w for c in counts.values()):
                    hits.setdefault((rec["dataset"], rec["index"]), {})[r] = (e, len(sums) - len(counts),
                                                                             len(sums), w)
                    break
    out = []
    for (dataset, _), per in sorted(hits.items(), key=str):
        e, dup, total, w = per[min(per)]
        out.append(Finding("worker-duplicates", tuple(sorted(per)),
                           f"DataLoader over {dataset} (an IterableDataset), num_workers={w}", epoch=e, count=dup,
                           of=total))
    return out


def _collective_args(recs: dict[int, dict], ranks: tuple[int, ...]) -> list[Finding]:
    """A reduction that every rank called at the same call number with another reduce op (the hook's call records,
    ``callsites.args_differ``): one call makes one reduction, so the ranks that asked for another did not get it
    (gloo, measured: both ranks got SUM where rank 1 asked for MAX). Only the reduce op: a root, shape or group that
    differs hangs or fails the call (shown in the diagnosis from ``RunResult.args_differ``), or is a backend's
    uneven all_gather that works by design."""
    from ddplab.engine.callsites import args_differ
    from ddplab.facts import CallSite
    calls = {r: tuple(CallSite.from_dict(c) for c in recs[r].get("calls") or ()) for r in ranks}
    d = args_differ(calls)
    if d is None or d.arg != "reduce_op":
        return []
    # the ranks apart from the majority; with none (a tie, each rank its own op), the ranks apart from the lowest
    # rank's op: at least those did not get the reduction they asked for
    lowest = dict(d.values).get(min(r for r, _ in d.values))
    odd = d.minority or tuple(r for r, v in d.values if v != lowest)
    return [Finding("reduce-op-differs", odd, f"{d.op} (call #{d.n}, {d.param or d.arg})", values=d.values)]
