"""The server's own counters, in Prometheus' text format at GET /metrics: requests by route and
status, those in flight, latency by route (a histogram), and the tokens the engine reported.
llama-cpp-python's server has no metrics route; vLLM's has its own at the same path, which this
one stands in front of (its figures are the request path's, not the engine's internals)."""

from __future__ import annotations

import threading
from collections import defaultdict

# seconds: from a short answer on CPU to a long one on a slow host
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.in_flight = 0
        self.latency_buckets: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = defaultdict(float)
        self.latency_count: dict[str, int] = defaultdict(int)
        self.tokens: dict[str, int] = defaultdict(int)  # "prompt", "completion"

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.in_flight -= 1
            self.requests[(route, status)] += 1
            buckets = self.latency_buckets.setdefault(route, [0] * len(BUCKETS))
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    buckets[i] += 1
            self.latency_sum[route] += seconds
            self.latency_count[route] += 1

    def add_usage(self, usage: dict) -> None:
        """An answer's `usage` (OpenAI's prompt_tokens and completion_tokens)."""
        with self._lock:
            for kind in ("prompt", "completion"):
                value = usage.get(f"{kind}_tokens")
                if isinstance(value, int) and value >= 0:
                    self.tokens[kind] += value

    def render(self) -> bytes:
        with self._lock:
            lines = [
                "# HELP hanlm_requests_total Requests answered, by route and HTTP status.",
                "# TYPE hanlm_requests_total counter",
            ]
            for (route, status), count in sorted(self.requests.items()):
                lines.append(f'hanlm_requests_total{{route="{route}",status="{status}"}} {count}')
            lines += [
                "# HELP hanlm_requests_in_flight Requests received and not yet answered.",
                "# TYPE hanlm_requests_in_flight gauge",
                f"hanlm_requests_in_flight {self.in_flight}",
                "# HELP hanlm_request_seconds Time from a request's arrival to its answer's end.",
                "# TYPE hanlm_request_seconds histogram",
            ]
            for route, buckets in sorted(self.latency_buckets.items()):
                for bound, count in zip(BUCKETS, buckets, strict=True):
                    lines.append(
                        f'hanlm_request_seconds_bucket{{route="{route}",le="{bound}"}} {count}'
                    )
                count = self.latency_count[route]
                lines.append(f'hanlm_request_seconds_bucket{{route="{route}",le="+Inf"}} {count}')
                lines.append(
                    f'hanlm_request_seconds_sum{{route="{route}"}} {self.latency_sum[route]:.6f}'
                )
                lines.append(f'hanlm_request_seconds_count{{route="{route}"}} {count}')
            lines += [
                "# HELP hanlm_tokens_total Tokens in answered requests' usage, by kind.",
                "# TYPE hanlm_tokens_total counter",
            ]
            for kind in ("prompt", "completion"):
                lines.append(f'hanlm_tokens_total{{kind="{kind}"}} {self.tokens[kind]}')
        return ("\n".join(lines) + "\n").encode()
