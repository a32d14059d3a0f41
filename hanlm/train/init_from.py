"""Continued pretraining: the model `model.init_from` names, built with its own weights.

The model is built from its config on the meta device, placed (under FSDP2 each rank allocating
its shards only) and filled from its safetensors, each rank reading what it keeps
(hanlm.train.pretrained), exactly as SFT starts from a model. Where its vocabulary grows (the
tokenizer stage added tokens: `tokenizer.extend`), or its tensors cannot be read part by part,
it is loaded whole on the host instead, grown there, and then placed. A grown row is set by the
rule the tokenizer stage recorded (hanlm.data.base_tokenizer):

- `pieces`: the mean of the model's rows for the token ids its old tokenizer splits the new
  token's text into, in the input embedding and (untied) in the output head alike;
- `mean`: the mean of the model's rows for every token of its old tokenizer.

Rows past the tokenizer (a model's padded spare rows) are kept as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from hanlm import model as model_lib
from hanlm.console import info, warn
from hanlm.data.base_tokenizer import EXTENSION_FILE
from hanlm.files import read_json
from hanlm.model_folder import vocab_rows
from hanlm.train import export, parallel, pretrained


def new_rows(weight: torch.Tensor, extension: dict, old_rows: int) -> torch.Tensor:
    """The rows of the added tokens, by the rule `extension` names (see the module docstring)."""
    old = weight[:old_rows].float()
    out = []
    for token in extension["tokens"]:
        if extension["init"] == "pieces" and token["pieces"]:
            out.append(old[torch.tensor(token["pieces"])].mean(dim=0))
        else:
            out.append(old.mean(dim=0))
    return torch.stack(out).to(weight.dtype)


def _grown(base: Path, rows: int, extension: dict | None, tokenizer_rows_before: int):
    """The whole model on the host, its vocabulary grown to `rows` and the new rows set."""
    model = export.load_exported(base).float()
    if rows > model.get_input_embeddings().weight.shape[0]:
        torch.manual_seed(0)  # rows past the added tokens' (none, unless padded): one value
        model.resize_token_embeddings(rows, mean_resizing=False)
    if extension:
        ids = torch.tensor([t["id"] for t in extension["tokens"]])
        matrices = [model.get_input_embeddings().weight]
        head = model.get_output_embeddings()
        if head is not None and head.weight is not matrices[0]:
            matrices.append(head.weight)
        with torch.no_grad():
            for weight in matrices:
                weight[ids] = new_rows(weight, extension, tokenizer_rows_before)
    return model.train()


def placed(
    base: Path,
    config,
    tokenizer_dir: Path,
    dist: parallel.Dist,
    mode: str,
    *,
    prepare: Callable[[torch.nn.Module], None],
    options: dict,
) -> torch.nn.Module:
    """The model of folder `base` as `config` describes it (hanlm.model.run_model_config) placed
    and parallelised with its weights. `prepare` runs on the built model before it is placed
    (document masking); `options` are parallel.parallelize_loaded's."""
    rows = config.get_text_config().vocab_size
    extension_file = Path(tokenizer_dir) / EXTENSION_FILE
    extension = read_json(extension_file) if extension_file.is_file() else None
    grows = extension is not None or rows != vocab_rows(base)
    problem = "its vocabulary grows" if grows else None
    model = None
    if problem is None:
        model = model_lib.build_model(config, device="meta")
        problem = pretrained.mismatch(model, "hf", base)
    if problem is None:
        prepare(model)

        def fill(target) -> None:
            pretrained.fill(target, "hf", base)

        return parallel.parallelize_loaded(model, dist, mode, fill=fill, **options)
    if dist.is_main and problem != "its vocabulary grows":
        warn(f"pretrain: every rank loads the whole model {base} ({problem})")
    before = rows if extension is None else min(t["id"] for t in extension["tokens"])
    model = _grown(base, rows, extension, before)
    if dist.is_main and extension:
        info(
            f"pretrain: {len(extension['tokens']):,} new token rows of {base.name} set by "
            f"{extension['init']} (tokenizer.extend_init)"
        )
    prepare(model)
    return parallel.parallelize_whole(model, dist, mode, **options)
