"""`POST /tokenize` of the HTTP simulator, and the render endpoints vLLM 0.32 answers 403 by default.

Why it exists: a router in front of vLLM reads a prompt's token ids from the engine itself. The vLLM
Router (0.1.17) does so for `cache_aware` on every request, asking each worker: first
`/v1/completions/render` (or `/v1/chat/completions/render`); on a 404, 405 or 501 there, `/tokenize`.
Any other refusal ends the attempt, and the 403 that `vllm serve` 0.32 answers on render unless started
with `--enable-scale-out` is one: the decision then falls back without tokens (the router's metric
`vllm_router_prefix_routing_decisions_total{outcome="missing_tokens"}`). So the simulator answers as
`vllm serve` does: render 403 by default, the token ids with `--enable-scale-out`; `/tokenize` always.
(Measured against the router binary with a stub worker per status code.)

The two forms are vLLM's (`vllm/entrypoints/serve/tokenize/protocol.py`): `{"prompt": text,
"add_special_tokens": true}` or `{"messages": [...], "add_generation_prompt": true, ...}`; the answer
`{"count", "max_model_len", "tokens", "token_strs": null}`. The ids are the ones the simulator's
completions and chat endpoints schedule (`tuner.sim.protocol`), so a router matching them sees the prefix
structure the replicas' prefix caches see.
"""

from __future__ import annotations

import uuid

from tuner.sim.protocol import BadRequest, json_object, parse_request, render_chat, served_model
from tuner.tokens import RegexCounter, TokenCounter

#: vLLM's answer to a render endpoint on a server started without `--enable-scale-out`.
SCALE_OUT_DISABLED = {"error": {
    "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
    "type": "PermissionDeniedError", "param": None, "code": 403}}
RENDER_PATHS = ("/v1/completions/render", "/v1/chat/completions/render", "/v1/responses/render")


def render_routes(served: tuple[str, ...], unauthorized, *, enabled: bool, tokens: TokenCounter | None = None):
    """(path, handler) of every render endpoint: the token ids when `enabled` (completions and chat; the
    Responses API's render is not simulated), else vLLM's 403."""
    if not enabled:
        return [(path, scale_out_disabled) for path in RENDER_PATHS]
    return [(RENDER_PATHS[0], render_endpoint(False, served, unauthorized, tokens=tokens)),
            (RENDER_PATHS[1], render_endpoint(True, served, unauthorized, tokens=tokens))]


def tokenize_body(raw: bytes, *, served: tuple[str, ...], max_model_len: int,
                  tokens: TokenCounter | None = None) -> dict:
    """vLLM's `/tokenize` answer for a request body; raise `BadRequest` as vLLM would."""
    tokens = tokens or RegexCounter()
    body = json_object(raw)
    served_model(body, served)
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list):
            raise BadRequest("messages must be a list", param="messages")
        generation = bool(body.get("add_generation_prompt", True))
        if generation and body.get("continue_final_message"):
            raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        ids = tokens.ids(render_chat(messages, generation_prompt=generation),
                         special_tokens=bool(body.get("add_special_tokens", False)))
    elif isinstance(body.get("prompt"), str):
        ids = tokens.ids(body["prompt"], special_tokens=bool(body.get("add_special_tokens", True)))
    else:
        raise BadRequest("a tokenize request has `prompt` (a string) or `messages`", param="prompt")
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


def render_endpoint(chat: bool, served: tuple[str, ...], unauthorized, *, tokens: TokenCounter | None = None):
    """`/v1/completions/render` (a list of one generate request) or `/v1/chat/completions/render` (one), as
    `vllm serve --enable-scale-out` answers: the prompt's token ids, nothing generated."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    async def render(request: Request) -> Response:
        denied = unauthorized(request)
        if denied:
            return denied
        try:
            p = parse_request(await request.body(), chat=chat, served=served, tokens=tokens)
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)
        one = {"request_id": uuid.uuid4().hex, "token_ids": p.prompt_ids, "features": None,
               "sampling_params": {"max_tokens": p.max_tokens}, "model": p.model, "stream": p.stream}
        return JSONResponse(one if chat else [one])

    return render


def tokenize_endpoint(served: tuple[str, ...], unauthorized, *, max_model_len: int,
                      tokens: TokenCounter | None = None):
    """The `/tokenize` handler; `unauthorized(request)` is the server's API-key check."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    async def tokenize(request: Request) -> Response:
        denied = unauthorized(request)
        if denied:
            return denied
        try:
            return JSONResponse(tokenize_body(await request.body(), served=served, max_model_len=max_model_len,
                                              tokens=tokens))
        except BadRequest as e:
            return JSONResponse(e.body(), status_code=e.status)

    return tokenize


async def scale_out_disabled(request) -> object:
    """What `vllm serve` without `--enable-scale-out` answers on a render endpoint."""
    from starlette.responses import JSONResponse

    return JSONResponse(SCALE_OUT_DISABLED, status_code=403)


__all__ = ["tokenize_body", "tokenize_endpoint", "render_endpoint", "render_routes", "scale_out_disabled", "RENDER_PATHS", "SCALE_OUT_DISABLED"]
