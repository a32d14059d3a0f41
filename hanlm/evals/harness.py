"""Log-likelihood of continuations and greedy generation on any Hugging Face causal LM folder.

Tokenisation follows lm-evaluation-harness's HF backend so scores are comparable with it:
whitespace at the end of a context moves to the start of the continuation; context and
continuation are encoded together and split at the length of the encoded context; the tokenizer
adds its special tokens as it does by default (not when the text already starts with BOS); an
empty context is scored after the BOS (else EOS) token; inputs longer than the model's maximum
length lose tokens on the left.

Speed comes from three things lm-evaluation-harness does not do: rows are left-padded so that
every continuation ends at the last position and only those positions go through the LM head
(`logits_to_keep`), requests that feed the model the same tokens share one row, and each
distinct context is tokenised once.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from hanlm.console import warn
from hanlm.errors import UserError
from hanlm.inference import generate_ids, left_padded, load_folder, resolve_dtype
from hanlm.model_folder import from_hub, is_hub_id, is_model_folder

DEFAULT_MAX_LENGTH = 2048  # lm-evaluation-harness's fallback when the config names none
_LENGTH_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def require_model_folder(path: str | Path) -> Path:
    """`path` if it holds a model (config.json), or a Hub id's cached snapshot; else a
    UserError saying what it is instead."""
    if is_hub_id(path):
        return from_hub(str(path))
    path = Path(path)
    if is_model_folder(path):
        return path
    if not path.exists():
        raise UserError(
            f"model folder {path} does not exist",
            fix="give a Hugging Face model folder (config.json, weights, tokenizer) or a hanlm "
            "run directory with an exported model",
        )
    raise UserError(
        f"{path} is not a model folder: no config.json, and no exported model in it",
        fix=f"run `hanlm export --run {path}` first, or give a Hugging Face model folder",
    )


@dataclass
class Request:
    """One (context, continuation) pair, tokenised."""

    context: list[int]
    continuation: list[int]


class Model:
    """A causal LM and its tokenizer, ready to score and generate."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "fp32",
        batch_size: int = 32,
        share_prefixes: bool = True,
    ):
        resolve_dtype(dtype)  # a wrong dtype is refused before the folder is looked at
        if batch_size < 1:
            raise UserError(f"batch size must be at least 1, got {batch_size}")
        loaded = load_folder(
            require_model_folder(path),
            device=device,
            setting="eval.device",
            dtype=dtype,
            failure="cannot load the model in {path}",
            fix="give a folder written by `hanlm export` or `save_pretrained`",
        )
        self.path, self.model, self.tokenizer = loaded.path, loaded.model, loaded.tokenizer
        self.name = self.path.name if self.path.name not in ("hf",) else str(self.path)
        self.device = loaded.device
        self.batch_size = batch_size
        self.max_length = self._max_length()
        bos, eos = self.tokenizer.bos_token_id, self.tokenizer.eos_token_id
        self.prefix_token_id = bos if bos is not None else eos
        self._bos_text = (
            self.tokenizer.decode([self.prefix_token_id])
            if self.prefix_token_id is not None
            else None
        )
        self._encode_cache: dict[str, list[int]] = {}
        # contexts run once with their KV cache reused by every continuation (off: one row per
        # request, as lm-evaluation-harness does)
        self.share_prefixes = share_prefixes
        # newer transformers call the cache argument `cache`, older ones `past_key_values`
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def _max_length(self) -> int:
        # lm-evaluation-harness's rule (its key order, then the tokenizer's limit, then 2048),
        # not hanlm.inference.context_length: scores must match lm-eval's
        config = self.model.config
        for key in _LENGTH_KEYS:
            value = getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < 1_000_000_000:
            return limit
        return DEFAULT_MAX_LENGTH

    # --- tokenisation -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids as lm-evaluation-harness's `tok_encode` gives them (cached)."""
        ids = self._encode_cache.get(text)
        if ids is None:
            # verbose=False: no transformers warning per long text; callers warn once per batch
            kwargs: dict[str, Any] = {"verbose": False}
            if self._bos_text and text.startswith(self._bos_text):
                kwargs["add_special_tokens"] = False
            ids = self.tokenizer.encode(text, **kwargs)
            self._encode_cache[text] = ids
        return ids

    def encode_pair(self, context: str, continuation: str) -> Request:
        if context == "":
            cont = self.tokenizer.encode(continuation, add_special_tokens=False)
            if self.prefix_token_id != cont[0]:
                return Request([self.prefix_token_id], cont)
            return Request(cont[:1], cont[1:])
        spaces = len(context) - len(context.rstrip())
        if spaces:
            continuation = context[-spaces:] + continuation
            context = context[:-spaces]
        whole = self.encode(context + continuation)
        context_ids = self.encode(context)
        return Request(context_ids, whole[len(context_ids) :])

    # --- scoring ------------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Sum of log-probabilities of each continuation given its context, and whether greedy
        decoding would have produced it."""
        requests = [self.encode_pair(c, x) for c, x in pairs]
        return self.loglikelihood_tokens(requests)

    @torch.inference_mode()
    def loglikelihood_tokens(self, requests: Sequence[Request]) -> list[tuple[float, bool]]:
        for req in requests:
            if not req.continuation:
                raise ValueError("empty continuation: nothing to score")
        fits = [
            i
            for i, r in enumerate(requests)
            if len(r.context) + len(r.continuation) <= self.max_length + 1
        ]
        if len(fits) < len(requests):
            warn(
                f"{len(requests) - len(fits)} of {len(requests)} scored texts are longer than "
                f"{self.name}'s context of {self.max_length:,} tokens: they are scored on their "
                "last tokens only, their first ones dropped"
            )
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        if fits and self.share_prefixes:
            try:
                shared = self._shared_context([requests[i] for i in fits])
            except TypeError:  # a model class without logits_to_keep or a reorderable cache
                self.share_prefixes = False
            else:
                for i, result in zip(fits, shared, strict=True):
                    results[i] = result
        rest = [i for i, r in enumerate(results) if r is None]
        if rest:
            for i, result in zip(rest, self._rows([requests[i] for i in rest]), strict=True):
                results[i] = result
        return results  # type: ignore[return-value]

    def _shared_context(self, requests: Sequence[Request]) -> list[tuple[float, bool]]:
        """Run each distinct context once, keep its KV cache, then run every continuation
        (but its last token) on top of its context's cache."""
        contexts: dict[tuple[int, ...], int] = {}
        owner = [contexts.setdefault(tuple(r.context), len(contexts)) for r in requests]
        unique = list(contexts)
        by_context: dict[int, list[int]] = {}
        for i, c in enumerate(owner):
            by_context.setdefault(c, []).append(i)
        order = sorted(range(len(unique)), key=lambda c: -len(unique[c]))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for batch in self._batches(order, [len(u) for u in unique]):
            rows = [unique[c] for c in batch]
            members = [(j, i) for j, c in enumerate(batch) for i in by_context[c]]
            longer = [(j, i) for j, i in members if len(requests[i].continuation) > 1]
            ids, mask, positions = _left_padded(rows)
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=bool(longer),  # one-token answers (A-D letters) need no cache
                logits_to_keep=1,
            )
            first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            first_best = first.argmax(-1).cpu()
            heads = torch.tensor([requests[i].continuation[0] for _, i in members])
            rows_of = torch.tensor([j for j, _ in members])
            first_picked = first[rows_of.to(self.device), heads.to(self.device)].cpu()
            tails = {}
            if longer:
                tails = self._continue(
                    _output_cache(out), mask, [len(r) for r in rows], longer, requests
                )
            for k, (j, i) in enumerate(members):
                total = float(first_picked[k])
                greedy = bool(first_best[j] == heads[k])
                if i in tails:
                    total += tails[i][0]
                    greedy = greedy and tails[i][1]
                results[i] = (total, greedy)
        return results  # type: ignore[return-value]

    def _batches(self, order: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        """Rows sorted longest first, cut into batches of at most batch_size rows; a batch also
        ends where padding would exceed a quarter of it (long-tailed lengths)."""
        batches: list[list[int]] = []
        current: list[int] = []
        real = 0
        for index in order:
            n = lengths[index]
            if current:
                width = lengths[current[0]]
                if len(current) == self.batch_size or real + n < 0.75 * width * (len(current) + 1):
                    batches.append(current)
                    current, real = [], 0
            current.append(index)
            real += n
        if current:
            batches.append(current)
        return batches

    def _continue(self, cache, context_mask, context_lengths, pairs, requests) -> dict:
        """(summed log-probability, all greedy) of each continuation's tokens after the first,
        on the contexts' cache."""
        select = torch.tensor([j for j, _ in pairs])
        cache.reorder_cache(select.to(self.device))
        conts = [requests[i].continuation for _, i in pairs]
        width = max(len(c) for c in conts) - 1
        ids = torch.zeros((len(pairs), width), dtype=torch.long)
        targets = torch.zeros((len(pairs), width), dtype=torch.long)
        valid = torch.zeros((len(pairs), width), dtype=torch.bool)
        for k, c in enumerate(conts):
            ids[k, : len(c) - 1] = torch.tensor(c[:-1])
            targets[k, : len(c) - 1] = torch.tensor(c[1:])
            valid[k, : len(c) - 1] = True
        # right padding: later positions never affect earlier ones, whose scores are all we read
        lengths = torch.tensor([context_lengths[j] for j, _ in pairs])
        positions = lengths[:, None] + torch.arange(width)[None, :]
        mask = torch.cat(
            [context_mask[select], torch.ones((len(pairs), width), dtype=torch.long)], 1
        )
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            **{self._cache_argument: cache},
        ).logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets, valid = targets.to(self.device), valid.to(self.device)
        picked = logprobs.gather(2, targets[..., None]).squeeze(2).masked_fill(~valid, 0.0)
        hits = (logprobs.argmax(-1) == targets) | ~valid
        sums, greedy = picked.sum(1).cpu().tolist(), hits.all(1).cpu().tolist()
        return {i: (sums[k], greedy[k]) for k, (_, i) in enumerate(pairs)}

    def _rows(self, requests: Sequence[Request]) -> list[tuple[float, bool]]:
        # The model sees (context + continuation)[:-1], cut on the left to max_length; requests
        # with the same input share a row and read their continuation off its last positions.
        rows: dict[tuple[int, ...], int] = {}
        need: list[int] = []
        where: list[tuple[int, list[int]]] = []
        for req in requests:
            cont = req.continuation[-self.max_length :]
            row = tuple((req.context + req.continuation)[-(self.max_length + 1) :][:-1])
            index = rows.setdefault(row, len(rows))
            if index == len(need):
                need.append(0)
            need[index] = max(need[index], len(cont))
            where.append((index, cont))
        inputs = list(rows)
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        row_logprobs: dict[int, torch.Tensor] = {}
        for batch in self._batches(order, [len(r) for r in inputs]):
            keep = max(need[i] for i in batch)
            logprobs = self._last_logprobs([inputs[i] for i in batch], keep)
            for j, i in enumerate(batch):
                row_logprobs[i] = logprobs[j, keep - need[i] :].cpu()
        return [_score(row_logprobs[index][-len(cont) :], cont) for index, cont in where]

    def _last_logprobs(self, rows: list[tuple[int, ...]], keep: int) -> torch.Tensor:
        """Log-softmax over the vocabulary at the last `keep` positions of left-padded rows."""
        ids, mask, positions = _left_padded(rows)
        kwargs = {}
        if len(rows) > 1 and int(mask.min()) == 0:
            kwargs["attention_mask"] = mask.to(self.device)
        out = self._forward(ids.to(self.device), positions.to(self.device), keep, kwargs)
        return torch.log_softmax(out[:, -keep:].float(), dim=-1)

    def _forward(self, ids, positions, keep: int, kwargs: dict) -> torch.Tensor:
        try:
            return self.model(
                input_ids=ids, position_ids=positions, logits_to_keep=keep, **kwargs
            ).logits
        except TypeError:  # an older model class without logits_to_keep
            return self.model(input_ids=ids, position_ids=positions, **kwargs).logits

    # --- generation ---------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[str], *, stop: Sequence[str] = (), max_new_tokens: int = 256
    ) -> list[str]:
        """Greedy continuations, cut at the first stop sequence (not included)."""
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=self.model.generation_config.eos_token_id,
            stop_strings=list(stop) or None,
        )
        # as lm-evaluation-harness does: a prompt too long for the context loses its first tokens
        budget = max(1, self.max_length - max_new_tokens)
        whole = [self.encode(p) for p in prompts]
        cut = [len(ids) - budget for ids in whole if len(ids) > budget]
        if cut:
            warn(
                f"{len(cut)} of {len(prompts)} prompts are longer than {self.name}'s context of "
                f"{self.max_length:,} tokens with {max_new_tokens:,} left for the answer: their "
                f"first tokens were dropped (up to {max(cut):,} of a prompt)"
            )
        encoded = [ids[-budget:] for ids in whole]
        order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
        outputs: list[str] = [""] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            rows = [encoded[i] for i in batch]
            with _quiet_generation():
                new = generate_ids(
                    self.model, rows, pad_id=pad, generation_config=config, tokenizer=self.tokenizer
                )
            for i, ids in zip(batch, new, strict=True):
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                outputs[i] = cut_at_stop(text, stop)
        return outputs

    def apply_chat_template(self, prompt: str) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )


def _output_cache(output):
    # transformers 5 names it `cache` (reading `past_key_values` logs a deprecation), 4 does not
    return output["cache"] if "cache" in output else output.past_key_values  # noqa: SIM401 (lazy)


def _left_padded(rows: Sequence[Sequence[int]]):
    """Token ids, attention mask and position ids of rows padded on the left; positions count
    from each row's first real token, as if it were not padded."""
    ids, mask = left_padded(rows, 0)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _score(logprobs: torch.Tensor, continuation: Sequence[int]) -> tuple[float, bool]:
    """Summed log-probability of the continuation's tokens and whether each was the argmax."""
    target = torch.tensor(continuation)
    picked = logprobs.gather(1, target[:, None]).squeeze(1)
    return float(picked.sum()), bool((logprobs.argmax(-1) == target).all())


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    cut = len(text)
    for s in stop:
        if s:
            found = text.find(s)
            if found != -1:
                cut = min(cut, found)
    return text[:cut]


@contextlib.contextmanager
def _quiet_generation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
