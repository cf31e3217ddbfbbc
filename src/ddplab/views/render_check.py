"""Views of a ``ddplab.facts.CheckReport`` (``ddplab run --check``): the "ok, but ..." section of the
terminal and notebook views. Made from the report's fields when shown; never parsed back."""
from __future__ import annotations

import html as _html
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ddplab.facts import CheckReport, Finding, NotChecked

NOTHING = {"no-process-group": "nothing to check: no process group",
           "no-records": "nothing to check: no rank left check records (did any rank import torch?)",
           "not-ended": "nothing to check: the ranks imported torch but none reached its end "
                        "(the job was ended first), so none wrote its records"}
WHY = {"no-ddp-model": "no model wrapped in DistributedDataParallel, so replicas were not compared",
       "fsdp": "FSDP shards parameters (replicas are not meant to be equal), so they were not compared",
       "own-models-apart": "no model wrapped in DistributedDataParallel, and the parameters of this optimizer "
                           "differed across ranks from its first step: each rank built its own (tensor-parallel "
                           "shards do so by design; a model nothing averages does so by mistake: wrap it in DDP "
                           "with the same seed on every rank)",
       "no-training-loader": "no DataLoader epoch fed a DDP or FSDP forward with gradients, so the data was not compared",
       "iterable-loader": "the training data came from an IterableDataset, which hands out no sample indices, so "
                          "which samples each rank saw was not compared (only whether its workers repeated batches)"}


def _ranks(rs) -> str:
    rs = list(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def finding_sentence(f: "Finding") -> str:
    """What was found, in one sentence (without the fix)."""
    k, who = f.kind, _ranks(f.ranks)
    if k == "replicas-differ":
        since = f", still equal at step {f.since_equal}" if f.since_equal is not None else ""
        printed = ""
        if f.cause == "printed-setting-differs" and f.label:
            vals = "; ".join(f"rank {r} {v}" for r, v in (f.values or ()))
            printed = (f"; the ranks' own output shows they ran with different values of `{f.label}` ({vals}), "
                       f"which no step through the wrapper makes equal")
        return (f"replicas drifted apart: {who} had parameters different from rank 0's at step {f.step}{since} "
                f"({f.count} of {f.of} tensors differ; first: {f.object}){printed}")
    if k == "buffers-differ":
        return (f"buffers differ: {who} had buffers different from rank 0's at step {f.step} "
                f"({f.count} of {f.of}; first: {f.object})")
    split = ("; each rank's Subset holds other indices: the split was made on each rank"
             if f.cause == "split-differs" else "")
    if k == "samples-overlap":
        return (f"samples seen twice: in epoch {f.epoch}, {f.count} of {f.of} samples went to more than one rank "
                f"({who}; {f.object}){split}")
    if k == "samples-dropped":
        held = f" besides the {f.held_out} the split holds out" if f.held_out else ""
        return f"samples never seen: in epoch {f.epoch}, {f.count} of {f.of} samples went to no rank{held} ({f.object}){split}"
    if k == "same-order":
        return (f"the same order every epoch: {f.count} of {f.of} epochs repeated epoch 0's sample order exactly "
                f"on {who} ({f.object})")
    if k == "step-in-no-sync":
        return (f"gradients not synchronised: {who} took {f.count} of {f.of} optimizer steps on gradients computed "
                f"inside no_sync() (first at step {f.step}); they never met the other ranks")
    if k == "unequal-accumulation":
        return (f"unequal accumulation: {who} ran a different number of forwards per optimizer step than rank 0 "
                f"(first at step {f.step}, {f.count} of {f.of} steps)")
    if k == "grad-missing":
        return (f"a parameter without a gradient on some ranks: {f.object} had none on {who} at step {f.step} "
                f"({f.count} of {f.of} steps)")
    if k == "update-outside-ddp":
        return (f"updates outside the DDP wrapper: {who} took {f.count} optimizer steps with no forward through DDP "
                f"since the step before (first at step {f.step}), so no gradient was averaged")
    if k == "steps-without-gradients":
        return (f"nothing trained: at every one of the {f.of} optimizer steps on {who}, none of the optimizer's "
                f"parameters had a gradient, so the steps changed nothing")
    if k == "same-inputs":
        return (f"the same data on every rank: at each of the {f.count} checked forwards (the first at step "
                f"{f.step}) {who} gave the model bit-identical inputs, so they trained on one stream of data, "
                f"the work of one rank")
    if k == "init-differs":
        return (f"different initial weights: {who} built the model with parameters different from rank 0's, and "
                f"FSDP sharded them as they were (sync_module_states off, no checkpoint loaded before training), "
                f"so the model is put together from the shards of different initialisations ({f.object})")
    if k == "model-not-wrapped":
        return (f"each rank trained a model of its own: the {f.count} parameters of {f.object} were the same on "
                f"{who} at its first step and differ at the end (step {f.step}); no DDP or FSDP wrapper holds them "
                f"and no rank averaged them, so nothing made the ranks' updates one")
    if k in ("hyperparameter-differs", "optimizer-state-differs"):
        vals = "; ".join(f"rank {r}: {_value(v)}" for r, v in (f.values or ()))
        loaded = (f"{_ranks(f.loaded)} alone loaded the optimizer's state (load_state_dict), and "
                  if f.loaded else "")
        if f.values:
            return (f"the optimizers differ: {loaded}from step {f.step} {f.object} was not the same on every rank "
                    f"({vals}); DDP averaged the gradients, but each rank stepped with its own settings, so the "
                    f"replicas drift apart")
        return (f"the optimizers differ: {loaded}at step {f.step} the {f.object} differed across ranks; DDP averaged "
                f"the gradients, but each rank stepped with its own optimizer state, so the replicas drift apart")
    if k == "mode-differs":
        return (f"the model trained in another mode on some ranks: from step {f.step}, {who} ran the DDP model's "
                f"forwards with gradients with {f.modules} of its {f.modules_of} modules in eval mode (first: "
                f"{f.object}) where the other ranks had them in train mode ({f.count} of {f.of} training forwards); "
                f"BatchNorm then uses running statistics and dropout is off on those ranks alone")
    if k == "load-keys-missing":
        if f.cause == "key-prefix-in-checkpoint":
            why = f"; the checkpoint's keys carry a \"{f.prefix}\" prefix the model's lack"
        elif f.cause == "key-prefix-in-model":
            why = f"; the model's keys carry a \"{f.prefix}\" prefix the checkpoint's lack"
        else:
            why = ""
        return (f"a checkpoint loaded into nothing: on {who}, {f.object} left {f.count} of the module's {f.of} "
                f"parameters missing while {f.unexpected} of the given keys matched nothing{why}, so the model "
                f"kept the weights it had")
    if k == "eval-padding-repeats":
        return (f"evaluation samples scored twice: in evaluation {f.epoch} (batches drawn with gradients off), "
                f"{f.count} of the {f.of} samples went to two ranks ({who}; {f.object}): the sampler pads the "
                f"data to a multiple of the world size with repeats, and a metric summed over ranks counts them")
    if k == "eval-one-shard":
        return (f"an evaluation of one shard: {who} alone iterated {f.object} with gradients off and got "
                f"{f.count} of its {f.of} samples (its DistributedSampler share); no other rank iterated it, so "
                f"the other shares were never scored")
    if k == "worker-duplicates":
        return (f"every batch came once per worker: in epoch {f.epoch} on {who}, {f.count} of the {f.of} batches of "
                f"{f.object} were bit-identical repeats of another, each batch as many times as there are workers: "
                f"every worker iterated the whole dataset, so each sample was trained on that many times")
    if k == "reduce-op-differs":
        from ddplab.spans import label
        by: dict = {}
        for r, v in f.values or ():
            by.setdefault(v, []).append(r)
        vals = "; ".join(f"{label(rs)}: {_value(v)}" for v, rs in sorted(by.items(), key=lambda x: x[1][0]))
        return (f"one reduction, different reduce ops: the op of {f.object} was {vals}; one call makes one "
                f"reduction, so not every rank got the reduction it asked for")
    return f"{k}: {who}"


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    return "none" if v is None else str(v)


def not_checked_sentence(n: "NotChecked") -> str:
    return f"not checked: {WHY.get(n.why, n.why)}" + (f" ({n.detail})" if n.detail else "")


def check_lines(report: "CheckReport | None") -> list[str]:
    """The terminal section (indented lines, as in ``render.explain``); nothing when --check was off."""
    if report is None:
        return []
    if report.nothing:
        return [f"  {NOTHING.get(report.nothing, report.nothing)}"]
    lines = []
    if report.findings:
        lines.append(f"  ok, but --check found {len(report.findings)} problem(s) the ranks' own records show:")
        for f in report.findings:
            lines.append(f"    - {finding_sentence(f)}.")
            lines.append(f"      fix: {f.fix}.")
    elif report.models or report.loader_epochs:
        lines.append(f"  --check: nothing found ({report.models} DDP model(s), {report.checksums} checksum(s) "
                     f"every {report.every} forwards, {report.loader_epochs} training epoch(s) of data compared).")
    elif report.own_models:
        lines.append(f"  --check: nothing found (no DDP model; the parameters of {report.own_models} optimizer(s) "
                     f"compared across ranks at their first step and at the end: equal).")
    lines += [f"  {not_checked_sentence(n)}." for n in report.not_checked]
    return lines


def check_html(report: "CheckReport | None") -> str:
    if report is None:
        return ""
    e = _html.escape
    if report.nothing:
        return f"<p><b>--check:</b> {e(NOTHING.get(report.nothing, report.nothing))}</p>"
    extra = "".join(f"<li>{e(not_checked_sentence(n))}</li>" for n in report.not_checked)
    if not report.findings and report.own_models and not (report.models or report.loader_epochs):
        return (f"<p><b>--check:</b> nothing found (no DDP model; the parameters of {report.own_models} optimizer(s) "
                f"compared across ranks: equal).</p>" + (f"<ul>{extra}</ul>" if extra else ""))
    if not report.findings and not (report.models or report.loader_epochs):
        return f"<ul>{extra}</ul>" if extra else ""
    if not report.findings:
        return (f"<p><b>--check:</b> nothing found ({report.models} DDP model(s), {report.checksums} checksum(s), "
                f"{report.loader_epochs} training epoch(s) of data compared).</p>" + (f"<ul>{extra}</ul>" if extra else ""))
    items = "".join(f"<li>{e(finding_sentence(f))}.<br><i>fix:</i> {e(f.fix)}.</li>" for f in report.findings)
    return (f"<div><p><b style='color:#9a6700'>ok, but ...</b> --check found {len(report.findings)} problem(s):</p>"
            f"<ul>{items}{extra}</ul></div>")
