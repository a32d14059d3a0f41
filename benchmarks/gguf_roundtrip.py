"""hanlm's GGUF export run by llama.cpp itself (llama-cpp-python) against transformers.

For an exported model folder (a run's sft/hf or pretrain/hf, or --model DIR) it writes GGUF f16
and q8_0 files with `hanlm.share.gguf`, loads them with `llama_cpp.Llama` and, on 12 Korean
prompts:

* tokenisation: llama.cpp's ids for each prompt (its pre-tokenizer type from the file) equal the
  Hugging Face tokenizer's, and so do a few thousand KorQuAD paragraphs' when ../shared/data
  has them;
* greedy continuations (argmax, --new-tokens tokens or until an end token) token for token,
  and the largest |logit difference| over the prompt and the continuation (f16);
* q8_0: how many continuations are identical, and the share of tokens before the first
  difference;
* the chat template through llama.cpp's chat API (`create_chat_completion`, temperature 0):
  the prompt its Jinja formatter renders tokenises to transformers' `apply_chat_template` ids,
  and its answer equals transformers' greedy answer.

`--as-qwen2` swaps an old tokenizer's pre-tokenizer (llama.cpp `smollm`) for hanlm's current one
(`qwen2`, same vocabulary and merges), to run the `qwen2` path with an older run's weights.

    python benchmarks/gguf_roundtrip.py --run runs/demo            # needs llama-cpp-python
    python benchmarks/gguf_roundtrip.py --model runs/demo/sft/hf --as-qwen2
"""

from __future__ import annotations

import sys

# the script's folder holds `tokenize.py`, which would shadow the standard library's module
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import logging
import shutil
import tempfile
import time
import unicodedata
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KORQUAD = ROOT.parent / "shared" / "data" / "korquad" / "KorQuAD_v1.0_dev.json"

PROMPTS = [
    "뉴질랜드\n뉴질랜드는 오세아니아의",
    "캄보디아의 수도는",
    "9월 9일 일기\n아침부터 비가",
    "밤사이 눈이 내려서 길이",
    "대한민국의 수도는 서울이다. 서울의 인구는",
    "엄마를 도와 된장찌개를",
    "승민은 한 시간에 60km를 가는 자동차를 타고 5시간 동안",
    "도서관에서 빌린 책을",
    "오늘 아침에는 2024년 3월 15일",
    "한국어 문장을 짧게 쓰면",
    '친구가 "내일 같이 공원에 가자"라고',
    "루마니아에 관한 자료는",
]
CHATS = [
    [{"role": "user", "content": "루마니아의 수도를 알려 주세요."}],
    [{"role": "user", "content": "세르비아가 속한 대륙은 어디예요?"}],
    [
        {"role": "system", "content": "당신은 친절하고 정확한 한국어 도우미입니다."},
        {"role": "user", "content": "캄보디아의 수도는 어디인가요?"},
    ],
    [
        {
            "role": "user",
            "content": "이 문제 좀 풀어 주세요. 민수는 사과 3개를 샀고 4개를 더 샀습니다. 모두 몇 개일까요?",
        }
    ],
]


def model_folder(args) -> Path:
    if args.model:
        return Path(args.model)
    for sub in ("sft/hf", "pretrain/hf"):
        if (Path(args.run) / sub / "config.json").is_file():
            return Path(args.run) / sub
    raise SystemExit(f"no exported model in {args.run} (sft/hf or pretrain/hf); run hanlm export")


def with_qwen2_pre_tokenizer(folder: Path, work: Path) -> Path:
    """A copy of `folder` whose tokenizer splits text with hanlm's current pre-tokenizer."""
    from hanlm.data import tokenizer

    copy = work / "as-qwen2"
    shutil.copytree(folder, copy)
    tok_json = json.loads((copy / "tokenizer.json").read_text(encoding="utf-8"))
    tok_json["pre_tokenizer"] = json.loads(tokenizer.build_untrained().to_str())["pre_tokenizer"]
    (copy / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), "utf-8")
    return copy


def hf_greedy(model, ids: list[int], new_tokens: int, stop: set[int]):
    """Greedy continuation with transformers (argmax, KV cache) and every position's logits."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        logits, past = [out.logits[0]], out.past_key_values
        generated: list[int] = []
        for _ in range(new_tokens):
            token = int(logits[-1][-1].argmax())
            generated.append(token)
            if token in stop:
                break
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            logits.append(out.logits[0])
            past = out.past_key_values
    return generated, torch.cat(logits).float().numpy()


def cpp_greedy(llm, ids: list[int], new_tokens: int, stop: set[int]):
    """The same with llama.cpp: evaluate the prompt, then feed back the argmax token."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    generated: list[int] = []
    for _ in range(new_tokens):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        generated.append(token)
        if token in stop:
            break
        llm.eval([token])
    return generated, np.array(llm.scores[: llm.n_tokens])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def korquad_paragraphs(limit: int) -> list[str]:
    if not KORQUAD.is_file():
        return []
    data = json.loads(KORQUAD.read_text(encoding="utf-8"))
    texts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    return [unicodedata.normalize("NFC", t) for t in texts[:limit]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/demo", help="a run whose export to use")
    parser.add_argument("--model", help="an exported Hugging Face folder (instead of --run)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--as-qwen2", action="store_true", help="see the module docstring")
    parser.add_argument("--korquad", type=int, default=964, help="paragraphs to tokenise")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="JSON file for the figures")
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit(
            "llama-cpp-python is not installed: pip install llama-cpp-python (builds llama.cpp)"
        ) from None
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hanlm.share import gguf as gguf_export

    warnings.filterwarnings("ignore", message=".*past_key_values.*")  # the KV cache's new name
    logging.getLogger("transformers").setLevel(logging.ERROR)
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="gguf-roundtrip-"))
    folder = source = model_folder(args)
    if args.as_qwen2:
        folder = with_qwen2_pre_tokenizer(folder, work)
    special = json.loads((folder / "special_tokens.json").read_text())
    stop = {special["eot"]["id"], special["eod"]["id"]}
    files = {}
    for kind in ("f16", "q8_0"):
        summary = gguf_export.write_gguf(folder, work / f"model-{kind}.gguf", gguf_type=kind)
        files[kind] = summary["out"]
    print(
        f"model {folder} -> GGUF ({summary['pre_tokenizer']} pre-tokenizer); "
        f"llama-cpp-python {llama_cpp.__version__}"
    )
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    # llama.cpp allocates at least 256 positions; llama-cpp-python's buffers must be as long
    n_ctx = max(model.config.max_position_embeddings, 256)
    llms = {
        kind: llama_cpp.Llama(
            path, n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=args.threads, seed=0
        )
        for kind, path in files.items()
    }

    # tokenisation of the prompts and of real Korean paragraphs
    texts = PROMPTS + korquad_paragraphs(args.korquad)
    same_tokens = sum(
        tok.encode(t, add_special_tokens=False)
        == llms["f16"].tokenize(t.encode("utf-8"), add_bos=False, special=False)
        for t in texts
    )

    rows = []
    print(f"\n{'prompt':<26} {'toks':>4} {'f16 same':>8} {'max|dlogit|':>11} {'q8_0 prefix':>11}")
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)
        ref, ref_logits = hf_greedy(model, ids, args.new_tokens, stop)
        f16, f16_logits = cpp_greedy(llms["f16"], ids, args.new_tokens, stop)
        q8, _ = cpp_greedy(llms["q8_0"], ids, args.new_tokens, stop)
        agree = len(ids) + common_prefix(ref, f16)  # positions where both saw the same input
        diff = float(np.abs(ref_logits[:agree] - f16_logits[:agree]).max())
        row = {
            "prompt": prompt,
            "prompt_tokens": len(ids),
            "tokenization_equal": ids
            == llms["f16"].tokenize(prompt.encode("utf-8"), add_bos=False, special=False),
            "transformers": tok.decode(ref),
            "f16_equal": ref == f16,
            "f16_max_logit_diff": diff,
            "q8_0_equal": ref == q8,
            "q8_0_prefix": common_prefix(ref, q8),
            "continuation_tokens": len(ref),
        }
        rows.append(row)
        shown = prompt.replace("\n", " ")[:24]
        print(
            f"{shown:<26} {len(ids):>4} {'yes' if row['f16_equal'] else 'NO':>8} {diff:>11.2e} "
            f"{row['q8_0_prefix']:>5}/{len(ref):<5}"
        )

    chats = []
    template = llms["f16"].metadata["tokenizer.chat_template"]
    formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=tok.eos_token,
        bos_token=tok.bos_token,
    )
    for messages in CHATS:
        rendered = formatter(messages=messages).prompt
        cpp_ids = llms["f16"].tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
        hf_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        hf_ids = list(hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids)
        ref, _ = hf_greedy(model, hf_ids, args.new_tokens, stop)
        answer_hf = tok.decode([t for t in ref if t not in stop], skip_special_tokens=True)
        llms["f16"].reset()  # its prompt cache would reuse the last greedy run's tokens
        reply = llms["f16"].create_chat_completion(
            messages=messages, temperature=0.0, max_tokens=args.new_tokens, repeat_penalty=1.0
        )
        answer_cpp = reply["choices"][0]["message"]["content"]
        chats.append(
            {
                "question": messages[-1]["content"],
                "template_ids_equal": cpp_ids == hf_ids,
                "answer_equal": answer_cpp == answer_hf,
                "finish_reason": reply["choices"][0]["finish_reason"],
                "answer": answer_cpp,
            }
        )
    for llm in llms.values():
        llm.close()

    n = len(rows)
    summary = {
        "model": f"{source}{' (pre-tokenizer swapped, --as-qwen2)' if args.as_qwen2 else ''}",
        "pre_tokenizer": gguf_export.read_vocab(
            folder, model.config.vocab_size, gguf_export.require_gguf()
        ).pre,
        "tokenization_equal": f"{same_tokens}/{len(texts)}",
        "f16_identical": f"{sum(r['f16_equal'] for r in rows)}/{n}",
        "f16_max_logit_diff": max(r["f16_max_logit_diff"] for r in rows),
        "q8_0_identical": f"{sum(r['q8_0_equal'] for r in rows)}/{n}",
        "q8_0_token_agreement": round(
            sum(r["q8_0_prefix"] for r in rows) / sum(r["continuation_tokens"] for r in rows), 4
        ),
        "chat_template_ids_equal": f"{sum(c['template_ids_equal'] for c in chats)}/{len(chats)}",
        "chat_answers_equal": f"{sum(c['answer_equal'] for c in chats)}/{len(chats)}",
        "seconds": round(time.time() - started, 1),
    }
    print("\nchat API (create_chat_completion, temperature 0):")
    for c in chats:
        print(
            f"  {c['question'][:30]:<32} template ids {'=' if c['template_ids_equal'] else '!='}"
            f"  answer {'=' if c['answer_equal'] else '!='} ({c['finish_reason']}): "
            f"{c['answer'][:40]!r}"
        )
    print("\nexamples (transformers' greedy continuation, equal in llama.cpp f16 when 'yes'):")
    for r in rows[:3]:
        print(f"  {r['prompt']!r} -> {r['transformers']!r}")
    print("\n" + "\n".join(f"{k}: {v}" for k, v in summary.items()))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"summary": summary, "prompts": rows, "chats": chats}, ensure_ascii=False)
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
