"""Many small httpx connection pools instead of one big one.

httpcore's pool re-examines every connection (and every idle one against all the others) each time a
request starts or ends, so its cost grows with the square of the connections it holds. An open-loop run
with a few hundred streams in flight spent most of its CPU there and sent requests hundreds of ms late
(measured with benchmarks/replay_precision.py). Spreading requests over `shards` transports, each request to
the least busy one, keeps every pool small; no pool has a connection limit that could queue a request,
because a queued request would be a silently delayed one.
"""

from __future__ import annotations

import ssl
import sys

import httpx

# httpcore tries `import sniffio` on every lock it sets up; when sniffio is not installed each failed
# import walks sys.path (~0.2 ms per request on the event loop). A None entry makes it fail at once, which
# is the same outcome httpcore already handles.
try:  # pragma: no cover - depends on the environment
    import sniffio  # noqa: F401
except ImportError:  # pragma: no cover
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]


class ShardedClient:
    """`shards` httpx transports for the load, and one ordinary client for control calls.

    Load requests go straight to an `httpx.AsyncHTTPTransport` (httpx's public transport API): the
    client layer above it (cookies, auth flows, redirects, event hooks) is unused here and cost ~12% of
    the client's CPU per request. `pick()` the least busy transport, `release()` it after.
    """

    def __init__(self, shards: int = 16, *, keepalive_per_shard: int = 32, keepalive_expiry_s: float = 30.0):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=keepalive_per_shard,
                              keepalive_expiry=keepalive_expiry_s)
        # One TLS context for all shards: building one reads the CA bundle (~20 ms each).
        tls = ssl.create_default_context()
        self.transports = [httpx.AsyncHTTPTransport(limits=limits, verify=tls) for _ in range(max(1, shards))]
        self.busy = [0] * len(self.transports)
        self.client = httpx.AsyncClient(timeout=30.0, verify=tls)

    def pick(self) -> int:
        i = min(range(len(self.busy)), key=self.busy.__getitem__)
        self.busy[i] += 1
        return i

    def release(self, i: int) -> None:
        self.busy[i] -= 1

    async def aclose(self) -> None:
        await self.client.aclose()
        for t in self.transports:
            await t.aclose()

    async def __aenter__(self) -> "ShardedClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
