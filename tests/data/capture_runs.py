"""Re-capture the run directories that tests/test_classify.py and tests/test_ledger.py read.

    .venv/bin/python tests/data/capture_runs.py              # every case
    .venv/bin/python tests/data/capture_runs.py hang_different_op

Each case is a real ``ddplab.run`` of a script in tests/scripts/ (or a lab); its run directory is
copied to tests/data/run_<case>/ as the ranks and torchrun left it (rank records, exception and exit
records, torchrun.json, the ranks' logs, result.json). While the job runs, every rank's flight
recorder is read through its worker server (``ddplab.engine.probe.ledger``) and the last answer is kept as
ranks/rankN.fr_trace.json: torch's own dump, unedited, for the ledger tests.
"""
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parent / "scripts"
sys.path.insert(0, str(HERE.parent.parent / "src"))

import ddplab  # noqa: E402
from ddplab.engine import probe  # noqa: E402

CASES = {
    # name: (target, run() keywords, accept(result) -> bool: keep this capture)
    "hang_different_op": (SCRIPTS / "my_train.py", dict(args=["--mode", "hang"]), lambda r: r.status == "hung"),
    "hang_different_sizes": (SCRIPTS / "size_mismatch.py", dict(args=["--sizes", "1,3"]), lambda r: r.status == "hung"),
    "hang_buffer_sync": (SCRIPTS / "buffer_sync.py", {}, lambda r: r.status == "hung"),
    "hang_rank_exited": (SCRIPTS / "rank_exits.py", dict(args=["--helper"]), lambda r: r.status == "hung"),
    "failed_rank_exited": (SCRIPTS / "rank_exits.py", {}, lambda r: r.status == "failed"),
    "failed_size_abort": (SCRIPTS / "size_mismatch.py", dict(args=["--sizes", "7,5"]), lambda r: r.status == "failed"),
    # torchrun names rank 0 (it lost its peer) as the root cause; rank 1 ran out of memory first.
    "oom_root_cause_is_the_peer": (SCRIPTS / "oom_then_linger.py", {},
                                         lambda r: json.loads((Path(r.run_dir) / "torchrun.json").read_text())
                                         .get("torchrun_root_cause") == 0),
}


class LedgerPoller(threading.Thread):
    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.stop, self.last = root, threading.Event(), {}

    def run(self):
        while not self.stop.is_set():
            for info in self.root.glob("*/*/ranks/rank*.json"):
                if info.name.count(".") != 1:
                    continue
                try:
                    d = json.loads(info.read_text())
                except (OSError, ValueError):
                    continue
                dump = probe.ledger(d["socket"], timeout_s=1.0) if d.get("socket") else None
                if dump and dump.get("entries"):
                    self.last[info.parent / f"rank{d['rank']}.fr_trace.json"] = dump
            time.sleep(0.3)


def capture(name: str, tries: int = 6) -> Path:
    target, kw, accept = CASES[name]
    for attempt in range(tries):
        root = Path(tempfile.mkdtemp(prefix=f"capture-{name}-"))
        poller = LedgerPoller(root)
        poller.start()
        r = ddplab.run(target, run_root=root, progress=None, **kw)
        poller.stop.set()
        poller.join()
        for path, dump in poller.last.items():
            path.write_text(json.dumps(dump, indent=1))
        if accept(r):
            out = HERE / f"run_{name}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(r.run_dir, out, ignore=shutil.ignore_patterns("*.sock", "command.json"))
            print(f"{name}: {r.status} {r.signature} -> {out.relative_to(HERE.parent.parent)}")
            shutil.rmtree(root, ignore_errors=True)
            return out
        print(f"{name}: try {attempt + 1} gave {r.status} {r.signature}; again")
        shutil.rmtree(root, ignore_errors=True)
    raise SystemExit(f"{name}: no acceptable capture in {tries} tries")


if __name__ == "__main__":
    for case in sys.argv[1:] or CASES:
        capture(case)
