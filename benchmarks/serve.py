"""`hanlm serve` (llama.cpp through llama-cpp-python's server, called with the `openai` client)
against `hanlm generate` (transformers in this process) on the same model and prompts, on CPU:
time to the first token and tokens per second, side by side.

Both decode greedily and write exactly --new-tokens tokens per answer (min and max both set), so
the rates compare the same work; both use --threads CPU threads. `hanlm generate`'s first token
is its streaming path's (`hanlm chat`'s): the prompt's forward pass and one step.

    python benchmarks/serve.py --model runs/demo/sft/hf
    python benchmarks/serve.py --model runs/demo/sft/hf --gguf-type q8_0 --threads 2
"""

from __future__ import annotations

import sys

# the script's folder holds `tokenize.py`, which would shadow the standard library's module
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "서울은 어디에 있나요?",
    "루마니아의 수도를 알려 주세요.",
    "된장찌개를 끓이는 방법을 짧게 설명해 주세요.",
    "한국어 문장을 짧게 쓰는 요령은 무엇인가요?",
    "도서관에서 빌린 책을 언제까지 돌려줘야 하나요?",
    "오늘 날씨가 추우면 무엇을 입어야 하나요?",
]


def hanlm_generate(model: Path, n: int, threads: int) -> list[dict]:
    import torch

    from hanlm.config import GenerateSection
    from hanlm.inference import chat_prompt, load, stream

    torch.set_num_threads(threads)
    loaded = load(model, device="cpu")
    settings = GenerateSection(greedy=True, max_new_tokens=n, min_new_tokens=n, batch_size=1)
    stream(loaded, chat_prompt(loaded, [{"role": "user", "content": "안녕"}]), settings)  # warm
    rows = []
    for prompt in PROMPTS:
        text = chat_prompt(loaded, [{"role": "user", "content": prompt}])
        started = time.perf_counter()
        first = None
        for piece in stream(loaded, text, settings):
            if piece and first is None:
                first = time.perf_counter() - started
        total = time.perf_counter() - started
        rows.append({"first_s": first, "total_s": total, "tokens": n})
    return rows


def hanlm_serve(model: Path, n: int, threads: int, gguf_type: str) -> tuple[list[dict], str]:
    import openai

    log = Path(tempfile.mkdtemp(prefix="hanlm-serve-bench-")) / "server.log"
    flags = ["--greedy", "--max-new-tokens", str(n), "--min-new-tokens", str(n)]
    cmd = [sys.executable, "-m", "hanlm", "serve", str(model), "--port", "0", *flags]
    cmd += ["--gguf-type", gguf_type, "--threads", str(threads)]
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 600
        while url is None and time.monotonic() < deadline:
            found = re.search(r"at (http://[^ ]+)/v1 ", log.read_text())
            url = found.group(1) if found else None
            if server.poll() is not None:
                raise SystemExit(f"hanlm serve ended:\n{log.read_text()}")
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=30)
        messages = [{"role": "user", "content": "안녕"}]
        client.chat.completions.create(model="m", messages=messages)  # warm, and up
        rows = []
        for prompt in PROMPTS:
            started = time.perf_counter()
            first, tokens = None, None
            chunks = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": prompt}], stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content and first is None:
                    first = time.perf_counter() - started
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            total = time.perf_counter() - started
            rows.append({"first_s": first, "total_s": total, "tokens": tokens or n})
        return rows, url
    finally:
        server.terminate()
        server.wait(timeout=60)


def summary(rows: list[dict]) -> dict:
    first = statistics.median(r["first_s"] for r in rows)
    rate = sum(r["tokens"] for r in rows) / sum(r["total_s"] for r in rows)
    decode = statistics.median(
        (r["tokens"] - 1) / (r["total_s"] - r["first_s"]) for r in rows if r["tokens"] > 1
    )
    return {"first_token_s": first, "tokens_per_s": rate, "decode_tokens_per_s": decode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "runs" / "demo" / "sft" / "hf")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gguf-type", default="f16")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no model folder at {args.model}: give --model DIR (e.g. RUN/sft/hf)")
    served, _ = hanlm_serve(args.model, args.new_tokens, args.threads, args.gguf_type)
    generated = hanlm_generate(args.model, args.new_tokens, args.threads)
    figures = {"hanlm generate": summary(generated), "hanlm serve": summary(served)}
    print(f"{len(PROMPTS)} chat prompts x {args.new_tokens} new tokens, greedy, "
          f"{args.threads} threads, llama.cpp on {args.gguf_type} GGUF")  # fmt: skip
    print(f"{'':16} {'first token':>12} {'tokens/s':>9} {'decode tok/s':>13}")
    for name, f in figures.items():
        print(f"{name:16} {f['first_token_s'] * 1000:10.1f}ms {f['tokens_per_s']:9.1f} "
              f"{f['decode_tokens_per_s']:13.1f}")  # fmt: skip
    g, s = figures["hanlm generate"], figures["hanlm serve"]
    print(f"serve / generate: first token {g['first_token_s'] / s['first_token_s']:.2f}x sooner, "
          f"tokens/s {s['tokens_per_s'] / g['tokens_per_s']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
