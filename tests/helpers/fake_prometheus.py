"""A tiny stand-in for the Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`) on 127.0.0.1.

It evaluates exactly the PromQL shapes `tuner.metrics.prometheus` sends, over canned data, so a test can
check the client's queries, its JSON handling and its old-name fallback without a Prometheus binary:

- `sum(M{sel})` / `avg(M{sel})` over a gauge series (range queries: one point per step);
- `sum(increase(M{sel}[R]))` and `sum by (le) (increase(M_bucket{sel}[R]))` from canned increases;
- a bare `M{sel}` (the info metric) returning its labels;
- `(A) or (B)`: A, or B when A is empty.

Every query is recorded (`queries`) with its parameters, for assertions on ranges and selectors.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_NAME = re.compile(r"vllm:[A-Za-z0-9_:]+")


@dataclass
class Data:
    gauges: dict[str, float] = field(default_factory=dict)          # metric -> constant value
    increases: dict[str, float] = field(default_factory=dict)       # M_total / M_sum / M_count -> value
    buckets: dict[str, dict[str, float]] = field(default_factory=dict)  # M_bucket -> {le: value}
    info: dict[str, dict[str, str]] = field(default_factory=dict)   # info metric -> labels


class FakePrometheus:
    def __init__(self, data: Data, selector_required: str | None = None):
        self.data = data
        self.selector_required = selector_required
        self.queries: list[dict] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakePrometheus":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- evaluation ----------------------------------------------------------------------------------
    def evaluate(self, q: str) -> list[tuple[dict, float]]:
        q = q.strip()
        parts = _split_or(q)
        if len(parts) > 1:
            for p in parts:
                res = self.evaluate(p)
                if res:
                    return res
            return []
        if self.selector_required and self.selector_required not in q:
            return []
        name = _NAME.search(q).group(0)
        if "increase(" in q:
            if "by (le)" in q:
                return [({"le": le}, v) for le, v in self.data.buckets.get(name, {}).items()]
            return [({}, self.data.increases[name])] if name in self.data.increases else []
        if q.startswith(("sum(", "avg(")):
            return [({}, self.data.gauges[name])] if name in self.data.gauges else []
        if name in self.data.info:
            return [({"__name__": name, **self.data.info[name]}, 1.0)]
        return []

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                u = urlparse(self.path)
                params = {k: v[0] for k, v in parse_qs(u.query).items()}
                fake.queries.append({"path": u.path, **params})
                res = fake.evaluate(params.get("query", ""))
                if u.path == "/api/v1/query":
                    at = float(params.get("time", 0))
                    result = [{"metric": m, "value": [at, repr(v)]} for m, v in res]
                    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
                elif u.path == "/api/v1/query_range":
                    start, end = float(params["start"]), float(params["end"])
                    step = float(params["step"].rstrip("s"))
                    n = int((end - start) / step + 1e-9) + 1
                    result = [{"metric": m, "values": [[start + i * step, repr(v)] for i in range(n)]}
                              for m, v in res]
                    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _split_or(q: str) -> list[str]:
    """Split `(A) or (B)` at top level; a query without a top-level `or` is returned whole."""
    depth, parts, cur = 0, [], ""
    i = 0
    while i < len(q):
        c = q[i]
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and q.startswith(" or ", i):
            parts.append(cur)
            cur, i = "", i + 4
            continue
        cur += c
        i += 1
    parts.append(cur)
    if len(parts) == 1:
        return parts
    return [p.strip()[1:-1] if p.strip().startswith("(") and p.strip().endswith(")") else p for p in parts]
