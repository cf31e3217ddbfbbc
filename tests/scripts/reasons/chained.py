"""An exception raised while handling another, and one raised `from` another: the first failing rank's
whole chain is the evidence.

    torchrun --nproc-per-node 2 tests/scripts/reasons/chained.py
"""
import json

import torch.distributed as dist


def read_config(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError("the config is not valid JSON") from e      # BROKEN: a stray comma in the config


def main() -> None:
    dist.init_process_group("gloo")
    cfg = read_config('{"lr": 0.1,}') if dist.get_rank() == 0 else {}
    dist.barrier()
    print(cfg)


if __name__ == "__main__":
    main()
