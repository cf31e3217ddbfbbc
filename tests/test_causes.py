"""Known user mistakes named with their fix (ddplab.engine.causes): matched on what an error means
(exception type and key phrases) in messages captured from real runs, in the wordings other
torch versions used (as reported), and in real runs of a GPU script on this CPU-only torch."""
from pathlib import Path

import pytest

from ddplab.engine import causes, signatures
from test_signatures import EXPECTED

SCRIPTS = Path(__file__).parent / "scripts"
IDS = {c.id for c in causes.CAUSES}

# The same mistakes in other versions' words, as learners reported them (source in each row).
REPORTED = [
    ("AttributeError: 'module' object has no attribute '_cuda_setDevice'", "cuda-on-cpu-torch",
     "https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/267"),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device "
     "CUDA modules, but got device_ids 1", "ddp-device-ids-cpu", "https://github.com/pytorch/pytorch/issues/46821"),
    ("RuntimeError: Default process group has not been initialized, please make sure to call init_process_group.",
     "process-group-not-initialized", "https://github.com/megvii-model/YOLOF/issues/11"),
    ("RuntimeError: trying to initialize the default process group twice!", "process-group-initialized-twice",
     "https://github.com/NVIDIA/Megatron-LM/pull/521"),
    ("AssertionError: DistributedDataParallel is not needed when a module doesn't have any parameter that requires "
     "a gradient.", "ddp-no-trainable-parameters", "https://github.com/pytorch/pytorch/issues/45326"),
    ("ValueError: SyncBatchNorm expected input tensor to be on GPU", "syncbn-on-cpu",
     "https://github.com/open-mmlab/mmagic/issues/133"),
    ("train.py: error: unrecognized arguments: --local-rank=0", "launch-local-rank-arg",
     "https://github.com/XPixelGroup/BasicSR/issues/626"),
    ("ValueError: ProcessGroupGloo::gather: Incorrect output list size 1. Output list size should be 2, same as size "
     "of the process group.", "collective-list-size", "https://github.com/pytorch/pytorch/pull/27439"),
    ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
     "reasons: 1) Use of a module parameter outside the `forward` function.", "ddp-parameter-ready-twice",
     "https://github.com/Lightning-AI/pytorch-lightning/issues/4033"),
]


def test_every_cause_has_a_captured_message_sources_and_a_fix():
    assert IDS <= set(EXPECTED.values()), IDS - set(EXPECTED.values())
    for c in causes.CAUSES:
        assert c.sources and all(u.startswith("https://") for u in c.sources), c.id
        assert len(c.explanation.splitlines()) == 2, c.id
    for name, sig in EXPECTED.items():
        if sig in IDS:
            head = (Path(__file__).parent / "data" / name).read_text().splitlines()[:2]
            # captured here; or, for a GPU-only message (NCCL) on this CPU machine, reported with its thread
            assert "torch 2.13" in head[0] or (name.startswith("reported_") and "https://github.com/" in head[1]), name


@pytest.mark.parametrize("text,expected,source", REPORTED)
def test_other_wordings_name_the_same_cause(text, expected, source):
    found = signatures.match_text(text)
    assert found is not None and found[0].id == expected, (source, found)


def test_a_phrase_under_another_exception_type_is_not_the_cause():
    # the meaning is the type and the phrases together: a log line quoting a phrase is not the error
    assert causes.CAUSES[0].search("print: _cuda_setDevice is missing") is None
    assert signatures.match_text("KeyError: 'device_ids'") [0].id == "python-exception"


def test_an_unknown_exception_names_no_lab():
    sig, line = signatures.match_text("ValueError: learning rate must be positive")
    assert sig.id == "python-exception" and sig.lab == "" and line == "ValueError: learning rate must be positive"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mistake,env,expected", [
    ("set-device", {}, "cuda-on-cpu-torch"),
    ("device-ids", {}, "ddp-device-ids-cpu"),
    ("local-rank-arg", {}, "launch-local-rank-arg"),
    ("none", {"GLOO_SOCKET_IFNAME": "^lo"}, "gloo-ifname-exclusion"),
])
def test_a_gpu_script_on_this_cpu_torch_gets_the_cause_and_its_fix(run_lab, mistake, env, expected):
    r = run_lab(SCRIPTS / "cpu_laptop.py", env={"MISTAKE": mistake, **env})
    assert (r.status, r.signature) == ("failed", expected), r.explain()
    text = r.explain()
    assert signatures.get(expected).explanation.splitlines()[1] in text
    assert ("Lab 01" not in text) and ("python exception" not in text.lower())


def test_the_cpu_route_runs(run_lab):
    r = run_lab(SCRIPTS / "cpu_laptop.py", env={"MISTAKE": "none"})
    assert r.status == "ok", r.explain()
