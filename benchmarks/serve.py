"""`hanlm serve` side by side with what it stands on, on CPU, in two comparisons:

--against generate (the default): `hanlm serve` (llama.cpp through llama-cpp-python's server,
called with the `openai` client) against `hanlm generate` (transformers in this process) on the
same model and prompts: time to the first token and tokens per second. Both decode greedily and
write exactly --new-tokens tokens per answer (min and max both set), so the rates compare the
same work; both use --threads CPU threads. `hanlm generate`'s first token is its streaming
path's (`hanlm chat`'s): the prompt's forward pass and one step.

--against engine: what hanlm's gateway (hanlm/serve/gateway.py) costs. llama-cpp-python's own
server started directly (its app under uvicorn, as `python -m llama_cpp.server` runs it, with
the access log off as in hanlm) and `hanlm serve` on the same GGUF file,
the same threads and context, both started at once and loaded in alternating rounds (one at a
time) by 1, 8 and 32 concurrent clients (asyncio, httpx) sending chat requests that set every
sampling field (greedy, --new-tokens min and max), so both do the same work: requests/s and
p50/p95 latency, the median of --repeats rounds, and the ratio's range over the rounds (on a
shared machine a round's speed drifts; pairing the rounds cancels most of it); then a --soak-s
soak of `hanlm serve` under 8 clients: errors,
and the server's resident memory sampled every few seconds (flat: the last sample within 5% of
the first after warm-up).

    python benchmarks/serve.py --model runs/demo/sft/hf
    python benchmarks/serve.py --model runs/demo/sft/hf --gguf-type q8_0 --threads 2
    python benchmarks/serve.py --model runs/demo/sft/hf --against engine --soak-s 120
"""

from __future__ import annotations

import sys

# the script's folder holds `tokenize.py`, which would shadow the standard library's module
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import asyncio
import json
import os
import re
import socket
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


# -- --against engine: the gateway's cost, and a soak ---------------------------------------------


def start_server(cmd: list[str], log: Path, url_pattern: str | None, port: int | None):
    """A server process and its base URL once it answers a chat request."""
    import httpx

    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    deadline, url = time.monotonic() + 600, None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"{cmd[:4]} ended:\n{log.read_text()}")
        if url is None:
            if url_pattern is None:
                url = f"http://127.0.0.1:{port}"
            else:
                found = re.search(url_pattern, log.read_text())
                url = found.group(1) if found else None
        if url is not None:
            try:
                httpx.post(f"{url}/v1/chat/completions", json=chat_request("안녕", 2), timeout=30)
                return server, url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit(f"{cmd[:4]} did not start:\n{log.read_text()}")


# llama-cpp-python's own app and uvicorn, as `python -m llama_cpp.server` runs them, with its
# settings given as hanlm gives them, and uvicorn's access log off as hanlm has it (one log line a
# request would slow the engine alone, not hanlm's layer)
ENGINE_ALONE = """
import sys, uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ModelSettings, ServerSettings
gguf, context, threads, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = ModelSettings(model=gguf, model_alias="bench", n_ctx=context, last_n_tokens_size=context,
                      verbose=False, n_threads=threads, n_threads_batch=threads)
app = create_app(server_settings=ServerSettings(interrupt_requests=False), model_settings=[model])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chat_request(prompt: str, n: int) -> dict:
    """Every sampling field either server could fill in set (at llama-cpp-python's own
    defaults where [generate] has one too: top_k 40, top_p 0.95), so both do the same work."""
    return {"model": "bench", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": n, "min_tokens": n, "temperature": 0.0, "top_k": 40, "top_p": 0.95,
            "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "seed": 0}  # fmt: skip


async def load(url: str, clients: int, requests_each: int, n: int) -> dict:
    """`clients` concurrent clients, each sending `requests_each` chat requests in turn."""
    import httpx

    latencies: list[float] = []
    errors = 0

    async def client(i: int, http) -> None:
        nonlocal errors
        for j in range(requests_each):
            body = chat_request(PROMPTS[(i + j) % len(PROMPTS)], n)
            started = time.perf_counter()
            response = await http.post(f"{url}/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - started)
            errors += response.status_code != 200

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_s": latencies[len(latencies) // 2],
        "p95_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))],
        "errors": errors,
        "requests": len(latencies),
    }


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its children, in MB."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def soak(url: str, pid: int, seconds: float, clients: int, n: int) -> dict:
    import httpx

    errors, done, samples = 0, 0, []
    stop_at = time.monotonic() + seconds

    async def client(i: int, http) -> None:
        nonlocal errors, done
        j = 0
        while time.monotonic() < stop_at:
            body = chat_request(PROMPTS[(i + j) % len(PROMPTS)], n)
            try:
                response = await http.post(f"{url}/v1/chat/completions", json=body)
                errors += response.status_code != 200
            except httpx.HTTPError:
                errors += 1
            done += 1
            j += 1

    async def sample() -> None:
        while time.monotonic() < stop_at:
            samples.append((round(seconds - (stop_at - time.monotonic()), 1), rss_mb(pid)))
            await asyncio.sleep(5)

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(sample(), *(client(i, http) for i in range(clients)))
    warm = [mb for t, mb in samples if t >= 10] or [mb for _, mb in samples]
    return {
        "requests": done,
        "errors": errors,
        "rss_mb": samples,
        "rss_first_mb": warm[0],
        "rss_last_mb": warm[-1],
        "rss_max_mb": max(warm),
    }


def against_engine(args) -> dict:
    from hanlm.serve.gateway import Gateway  # noqa: F401  (hanlm's layer: the one measured)
    from hanlm.serve.llama_cpp_engine import model_limits
    from hanlm.share.gguf import write_gguf

    folder = Path(tempfile.mkdtemp(prefix="hanlm-serve-bench-"))
    gguf = folder / "bench.gguf"  # the served name: bench
    write_gguf(args.model, gguf, gguf_type=args.gguf_type, name="bench")
    context, _ = model_limits(gguf)

    def engine():
        port = free_port()
        cmd = [sys.executable, "-c", ENGINE_ALONE, str(gguf), str(context), str(args.threads),
               str(port)]  # fmt: skip
        return start_server(cmd, folder / "engine.log", None, port)

    def hanlm():
        cmd = [sys.executable, "-m", "hanlm", "serve", str(gguf), "--port", "0",
               "--threads", str(args.threads)]  # fmt: skip
        return start_server(cmd, folder / "hanlm.log", r"at (http://[^ ]+)/v1 ", None)

    # Both servers up at once, only one loaded at a time: rounds alternate between them (the
    # order flipped each round), so the machine's drift falls on both alike; each level's
    # figure is the median over rounds, and the ratio's range over rounds is printed too.
    servers = {"engine": engine(), "hanlm": hanlm()}
    rounds: dict = {name: {c: [] for c in args.clients} for name in servers}
    try:
        for clients in args.clients:
            each = max(2, args.requests // clients)
            for r in range(args.repeats):
                order = ("engine", "hanlm") if r % 2 == 0 else ("hanlm", "engine")
                for name in order:
                    url = servers[name][1]
                    rounds[name][clients].append(
                        asyncio.run(load(url, clients, each, args.new_tokens))
                    )
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=60)
    figures: dict = {"rounds": rounds, "engine": {}, "hanlm": {}}
    print(f"{args.new_tokens} new tokens per chat answer, greedy, {args.threads} threads, "
          f"{args.gguf_type} GGUF, median of {args.repeats} alternating rounds")  # fmt: skip
    print(f"{'clients':>7} {'server':>22} {'req/s':>8} {'p50':>9} {'p95':>9} {'errors':>6}")
    for clients in args.clients:
        for name, label in (("engine", "llama-cpp-python alone"), ("hanlm", "hanlm serve")):
            got = rounds[name][clients]
            f = {
                k: statistics.median(g[k] for g in got)
                for k in ("requests_per_s", "p50_s", "p95_s")
            }
            f["errors"] = sum(g["errors"] for g in got)
            figures[name][clients] = f
            print(f"{clients:>7} {label:>22} {f['requests_per_s']:8.1f} {f['p50_s'] * 1000:7.1f}ms "
                  f"{f['p95_s'] * 1000:7.1f}ms {f['errors']:>6}")  # fmt: skip
        e, h = figures["engine"][clients], figures["hanlm"][clients]
        paired = [b["requests_per_s"] / a["requests_per_s"]
                  for a, b in zip(rounds["engine"][clients], rounds["hanlm"][clients], strict=True)]  # fmt: skip
        print(f"{'':>7} {'hanlm / engine':>22} {h['requests_per_s'] / e['requests_per_s']:8.3f} "
              f"{h['p50_s'] / e['p50_s']:8.3f}x {h['p95_s'] / e['p95_s']:8.3f}x   "
              f"req/s ratio by round {min(paired):.3f}-{max(paired):.3f}")  # fmt: skip
    if args.soak_s > 0:
        server, url = hanlm()
        try:
            figures["soak"] = asyncio.run(soak(url, server.pid, args.soak_s, 8, args.new_tokens))
        finally:
            server.terminate()
            server.wait(timeout=60)
        s = figures["soak"]
        print(f"soak, hanlm serve, 8 clients, {args.soak_s:g} s: {s['requests']} requests, "
              f"{s['errors']} errors; RSS after warm-up {s['rss_first_mb']:.1f} -> "
              f"{s['rss_last_mb']:.1f} MB (max {s['rss_max_mb']:.1f})")  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "runs" / "demo" / "sft" / "hf")
    parser.add_argument("--against", choices=("generate", "engine"), default="generate")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--gguf-type", default="f16")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32],
                        help="--against engine: concurrent clients")  # fmt: skip
    parser.add_argument("--requests", type=int, default=96,
                        help="--against engine: requests per load level (at least 2 a client)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2, help="--against engine: rounds")
    parser.add_argument("--soak-s", type=float, default=0, help="--against engine: soak length")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"no model folder at {args.model}: give --model DIR (e.g. RUN/sft/hf)")
    if args.against == "engine":
        figures = against_engine(args)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return
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
