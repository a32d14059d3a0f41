"""hanlm's harness (hanlm.evals.harness.Model) as an lm-evaluation-harness model: the `LM`
interface that lm-eval's own evaluator calls with the requests its tasks build.

lm-eval builds every prompt, few-shot context, choice and filter from the task's definition;
this scores the requests with hanlm's batched harness (shared contexts, last positions only) and
hands back what lm-eval's HF backend would: (log-likelihood, greedy) per continuation, summed
rolling-window log-likelihoods, and greedy generations cut at the task's `until` strings.
"""

from __future__ import annotations

from collections.abc import Sequence

from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from hanlm.evals.harness import Model, Request

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HF backend's, when a task names none


class HarnessLM(LM):
    """An lm-eval `LM` over a loaded hanlm harness model (one process, rank 0 of 1)."""

    def __init__(self, model: Model):
        super().__init__()
        self.harness = model

    def loglikelihood(self, requests: Sequence, disable_tqdm: bool = False) -> list:
        return self.harness.loglikelihood([tuple(r.args) for r in requests])

    def loglikelihood_rolling(self, requests: Sequence, disable_tqdm: bool = False) -> list:
        """Each text's log-likelihood over windows of the model's context, every token scored
        once, as lm-eval's HF backend cuts them (its own window functions)."""
        harness = self.harness
        windows, owner = [], []
        for index, request in enumerate(requests):
            (text,) = request.args
            pieces = get_rolling_token_windows(
                token_list=harness.encode(text),
                prefix_token=harness.prefix_token_id,
                max_seq_len=harness.max_length,
                context_len=1,
            )
            for context, continuation in map(make_disjoint_window, pieces):
                windows.append(Request(list(context), list(continuation)))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owner, harness.loglikelihood_tokens(windows), strict=True):
            totals[index] += logprob
        return totals

    def generate_until(self, requests: Sequence, disable_tqdm: bool = False) -> list[str]:
        """Greedy generations, batched by identical generation settings."""
        outputs: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            _, kwargs = request.args
            until = kwargs.get("until") or ()
            stops = (until,) if isinstance(until, str) else tuple(until)
            eos = self.harness.tokenizer.eos_token
            if eos and eos not in stops:
                stops += (eos,)  # as lm-eval's HF backend: the end of text ends the answer
            max_new = int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            groups.setdefault((stops, max_new), []).append(index)
        for (stops, max_new), members in groups.items():
            texts = self.harness.generate(
                [requests[i].args[0] for i in members], stop=stops, max_new_tokens=max_new
            )
            for i, text in zip(members, texts, strict=True):
                outputs[i] = text
        return outputs  # type: ignore[return-value]

    @property
    def tokenizer_name(self) -> str:
        return str(self.harness.tokenizer.name_or_path).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.harness.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt=True) -> str:
        return self.harness.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )
