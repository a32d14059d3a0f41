"""Library checks that need two gloo ranks, in one torchrun launch (each launch costs the suite
two ranks' imports of torch and transformers, 15-30 s here, much more than any check itself).

    torchrun --nproc_per_node 2 tests/workers/two_rank_checks.py OUT_DIR

Each check runs on both ranks in turn, in the same process group, and writes what it found into
OUT_DIR/NAME/; a rank that finished a check leaves OUT_DIR/NAME/done-R, and one that failed it
leaves the traceback in OUT_DIR/NAME/error-R.txt before the launch stops. The tests of each
check are in tests/integration/test_two_ranks.py.
"""

import sys
import traceback
from pathlib import Path

import fsdp_init_ranks
import lora_ranks
import loss_ranks
import row_scale_training
import torch

from hanlm.train import parallel

CHECKS = {
    "fsdp_init": fsdp_init_ranks.run,
    "loss": loss_ranks.run,
    "row_scale": row_scale_training.run,
    "lora": lora_ranks.run,
}


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist = parallel.init("cpu")
    try:
        for name, check in CHECKS.items():
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            try:
                check(dist, folder)
            except BaseException:
                (folder / f"error-{dist.rank}.txt").write_text(traceback.format_exc())
                raise
            (folder / f"done-{dist.rank}").touch()
    finally:
        parallel.shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
