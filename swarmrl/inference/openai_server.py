"""An OpenAI-compatible chat endpoint over our inference backend, for environments that call a model over HTTP
(verifiers' harnesses, any OpenAI client): ``POST /v1/chat/completions``, served by the worker or node on
127.0.0.1.

Token-in/token-out: each conversation is an episode (``X-Session-ID`` header, verifiers' session header; a request
without one is an episode of its own, not kept), tokenized by ``swarmrl.inference.chat_tokens.EpisodeTokens``: the prompt
is rendered and tokenized once, the model's sampled ids are kept as they are, and a later request only adds the
new messages' tokens. ``pop_episode`` hands the episode's row (prompt ids; model turns mask 1 with their sampling
logprobs; environment turns mask 0), the shape of our multi-turn rows; with ``capture_hidden``, each model turn's
final-norm states too (``EpisodeTokens.hidden``), for TOPLOC proofs over the model's tokens.

The response is a ``chat.completion`` (the message, with tool calls parsed from the text in the Hermes format,
``finish_reason``, ``usage``) plus the ids, in vLLM's ``return_token_ids`` fields: ``prompt_token_ids`` (the whole
prompt of this call) and ``choices[0].token_ids`` (the sampled ids, EOS included when sampled), and
``choices[0].logprobs.content`` when ``logprobs`` is set (the sampled tokens' logprobs; no alternatives).

Bounds (``ChatLimits``; a request over one gets 4xx, never a crash): the body's size as read (413), the messages
per request, the tokens a request asks for (OpenAI's ``max_tokens`` / ``max_completion_tokens``: at most
``max_turn_tokens``, which is also what a request naming neither gets), the prompt's tokens (400; code
``context_length_exceeded``, which ends a verifiers episode), the episodes held (429: pop them), the requests in
flight (429). ``n`` must be 1, ``stream`` false; one request at a time per episode (409). The backend samples one request
at a time (it is not thread-safe); requests wait for it in a worker thread, not on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.chat_tokens import SESSION_HEADER, ChatError, EpisodeTokens, parse_assistant
from swarmrl.inference.params import SamplingParams, TokenLimits
from swarmrl.inference.prompts import decode_completion
from swarmrl.utils.serving import gather_capped


@dataclass(frozen=True)
class ChatLimits:
    max_body_bytes: int = 1 << 20
    max_messages: int = 256
    max_tools: int = 64
    max_turn_tokens: int = TokenLimits().max_turn_tokens  # per model turn (a request); TokenLimits' default
    max_prompt_tokens: int = 8192  # the whole prompt of one call (the episode so far)
    max_episodes: int = 4096
    max_in_flight: int = 64


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use (user, metadata, ...)

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    logprobs: bool = False
    seed: int | None = Field(None, ge=0, lt=2**63)


CONTEXT_FULL = "context_length_exceeded"  # the error code of a prompt over max_prompt_tokens (OpenAI's code)


class _Reject(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class ChatEndpoint:
    """The endpoint's state: the backend, the tokenizer, the episodes by session id."""

    def __init__(self, backend: InferenceBackend, tokenizer: Any, limits: ChatLimits | None = None,
                 model_name: str = "swarmrl", capture_hidden: bool = False) -> None:
        self.backend, self.tokenizer = backend, tokenizer
        self.capture_hidden = capture_hidden  # keep each model turn's final-norm states (TOPLOC proofs)
        self.limits = limits or ChatLimits()
        self.model_name = model_name
        self._episodes: OrderedDict[str, EpisodeTokens] = OrderedDict()
        self._busy: set[str] = set()
        self._lock = threading.Lock()  # the episode table
        self._sample_lock = threading.Lock()  # the backend
        self._in_flight = 0

    def pop_episode(self, session_id: str) -> EpisodeTokens | None:
        """The episode's tokens, forgotten here (None: no such episode)."""
        with self._lock:
            if session_id in self._busy:
                raise RuntimeError(f"episode {session_id!r} has a request in flight")
            return self._episodes.pop(session_id, None)

    def _claim(self, sid: str | None) -> EpisodeTokens:
        if sid is None:
            return EpisodeTokens()  # a request without a session is an episode of its own, not kept
        with self._lock:
            if sid in self._busy:
                raise _Reject(409, "another request of this episode is in flight")
            ep = self._episodes.get(sid)
            if ep is None:
                if len(self._episodes) >= self.limits.max_episodes:
                    raise _Reject(429, f"{len(self._episodes)} episodes held; pop finished ones")
                ep = self._episodes[sid] = EpisodeTokens()
            self._busy.add(sid)
            return ep

    def _release(self, sid: str | None, ep: EpisodeTokens) -> None:
        if sid is None:
            return
        with self._lock:
            self._busy.discard(sid)
            if ep.turns == 0:  # its first request was refused: nothing to keep (nor to count against the limit)
                self._episodes.pop(sid, None)

    def _check(self, req: ChatRequest) -> SamplingParams:
        lim = self.limits
        if req.n != 1:
            raise _Reject(400, "n must be 1")
        if req.stream:
            raise _Reject(400, "stream is not supported")
        if len(req.messages) > lim.max_messages:
            raise _Reject(400, f"{len(req.messages)} messages, over {lim.max_messages}")
        if req.tools is not None and len(req.tools) > lim.max_tools:
            raise _Reject(400, f"{len(req.tools)} tools, over {lim.max_tools}")
        want = req.max_completion_tokens or req.max_tokens or lim.max_turn_tokens
        if want > lim.max_turn_tokens:
            raise _Reject(400, f"max_tokens {want} is over {lim.max_turn_tokens}")
        return SamplingParams(max_new_tokens=want, temperature=req.temperature, top_p=req.top_p)

    def _sample(self, prompt: list[int], params: SamplingParams, seed: int | None) -> tuple[list[int], list[float], Any]:
        with self._sample_lock:
            out = self.backend.generate([prompt], params, seeds=None if seed is None else [seed],
                                        capture_hidden=self.capture_hidden)
        hidden = out.hidden[0] if self.capture_hidden and out.hidden is not None else None
        return list(out.completion_ids[0]), [float(x) for x in out.logprobs[0]], hidden

    async def complete(self, req: ChatRequest, sid: str | None) -> dict[str, Any]:
        params = self._check(req)
        ep = self._claim(sid)
        try:
            snapshot = ep.snapshot()
            try:
                prompt = ep.extend(self.tokenizer, req.messages, req.tools)
            except ChatError as e:
                raise _Reject(400, str(e)) from None
            if len(prompt) > self.limits.max_prompt_tokens:
                ep.restore(snapshot)
                raise _Reject(400, f"the prompt is {len(prompt)} tokens, over {self.limits.max_prompt_tokens}",
                              CONTEXT_FULL)
            try:
                ids, logprobs, hidden = await asyncio.to_thread(self._sample, prompt, params, req.seed)
            except BaseException:
                ep.restore(snapshot)
                raise
            text = decode_completion(self.tokenizer, ids)
            message = parse_assistant(text, ep.turns)
            ep.reply(ids, logprobs, message)
            if hidden is not None:
                ep.hidden.append(hidden)
            return self._response(req, prompt, ids, logprobs, message)
        finally:
            self._release(sid, ep)

    def _response(self, req: ChatRequest, prompt: list[int], ids: list[int], logprobs: list[float],
                  message: dict[str, Any]) -> dict[str, Any]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        finish = "tool_calls" if message.get("tool_calls") else ("stop" if ids and ids[-1] == eos else "length")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "token_ids": ids,
                                  "logprobs": None}
        if req.logprobs:
            choice["logprobs"] = {"content": [
                {"token": self.tokenizer.convert_ids_to_tokens(i), "logprob": lp, "bytes": None, "top_logprobs": []}
                for i, lp in zip(ids, logprobs)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": req.model or self.model_name, "choices": [choice], "prompt_token_ids": prompt,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _Reject(413, f"the body is over {limit} bytes")
    body = await gather_capped(request.stream(), limit)
    if body is None:
        raise _Reject(413, f"the body is over {limit} bytes")
    return body


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status)


def make_app(endpoint: ChatEndpoint) -> FastAPI:
    app = FastAPI(title="swarmrl chat endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    gate = {"n": 0}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        if gate["n"] >= endpoint.limits.max_in_flight:
            return _error(429, f"{gate['n']} requests in flight")
        gate["n"] += 1
        try:
            body = await _read_body(request, endpoint.limits.max_body_bytes)
            try:
                req = ChatRequest.model_validate(json.loads(body))
            except ValidationError as e:
                return _error(422, f"bad request: {e}"[:2000])
            except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
                return _error(400, f"bad request: {type(e).__name__}: {e}"[:2000])
            sid = request.headers.get(SESSION_HEADER) or None
            if sid is not None and len(sid) > 256:
                return _error(400, "the session id is over 256 characters")
            out = await endpoint.complete(req, sid)
            return JSONResponse(out, headers={SESSION_HEADER: sid} if sid else None)
        except _Reject as e:
            return _error(e.status, str(e), e.code)
        finally:
            gate["n"] -= 1

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": endpoint.model_name, "object": "model", "owned_by": "swarmrl"}]}

    return app


class ServedEndpoint:
    """``make_app(endpoint)`` under uvicorn in a thread on ``host`` (127.0.0.1: the harness runs here);
    ``base_url`` is what an OpenAI client takes. ``close()`` stops it."""

    def __init__(self, endpoint: ChatEndpoint, host: str = "127.0.0.1", port: int = 0,
                 start_timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        config = uvicorn.Config(make_app(endpoint), host=host, port=port, log_level="warning", lifespan="off",
                                limit_concurrency=endpoint.limits.max_in_flight + 16)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="chat-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the chat endpoint did not start on {host}:{port}")
            time.sleep(0.01)
        sock = self._server.servers[0].sockets[0].getsockname()
        self.base_url = f"http://{host}:{sock[1]}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ServedEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

