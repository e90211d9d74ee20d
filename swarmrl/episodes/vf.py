"""Verifiers episodes: the model answers over an OpenAI-compatible chat endpoint, the environment's tools run here;
and the validator's replay of an episode's row.

``run_episode`` is the harness (verifiers' null/bash chat program, in this process): send the conversation, take
the reply; when it calls tools, run them (``ToolBox``) and append their results as ``tool`` messages; stop at a
reply without tool calls, after ``max_turns`` model turns, or when the next prompt would be over
``max_context_tokens`` (the endpoint answers ``context_length_exceeded``; the replay applies the same limit). The model is a ``ChatFn``: ``openai_chat`` (an OpenAI
client on our endpoint, ``swarmrl.inference.openai_server``, the episode named by its ``X-Session-ID``) or, in
the replay, the row's own model turns.

``rollout`` runs one episode against a served endpoint and returns its row: the endpoint's token-in/token-out ids
(prompt; model turns mask 1 with their sampling logprobs; environment turns mask 0) and the reward.

``replay_problem`` is what the validator re-checks on a row, with no model: the model turns are decoded and parsed
(``parse_assistant``, as the endpoint did), the episode is run again with a client that answers them in order, and
the ids are derived again with the endpoint's rule (``EpisodeTokens``). The row is rejected when its prompt is not
the rendering of the task's messages, when an environment turn is not what the environment answers (tool results,
the template's text around them), when the episode would end with another number of model turns, or when the
reward (verifiers' scoring of the replayed conversation) is not the claimed one. What it cannot re-check: that the
model turns were sampled by the policy (TOPLOC and the logprob checks do that), and anything a tool does that is not
a function of its arguments (time, network, randomness): such an environment fails its replay.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI, BadRequestError

from swarmrl.envs.base import Task
from swarmrl.envs.multiturn import segments
from swarmrl.envs.vf_env import Message, VerifiersEnv, conversation_text, run_sync
from swarmrl.inference.chat_tokens import SESSION_HEADER, ChatError, EpisodeTokens, parse_assistant
from swarmrl.inference.openai_server import CONTEXT_FULL, ChatEndpoint, ChatLimits, ServedEndpoint
from swarmrl.inference.prompts import decode_completion

ChatFn = Callable[[list[Message], list[Message] | None], Awaitable[Message]]


class ContextFull(Exception):
    """The next prompt would be over the environment's ``max_context_tokens``: the episode ends."""


async def run_episode(env: VerifiersEnv, task: Task, chat: ChatFn) -> list[Message]:
    """The whole conversation: the task's initial messages, then the model's and the tools' turns."""
    messages = env.initial_messages(task)
    box = env.tools(task)
    tools = box.declarations or None
    for turn in range(env.max_turns):
        try:
            reply = await chat(list(messages), tools)
        except ContextFull:
            if turn == 0:
                raise ValueError(f"task {task.task_id}: its prompt is over max_context_tokens "
                                 f"{env.max_context_tokens}") from None
            break  # the next prompt would be over the context: the episode ends after the last model turn
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls or turn + 1 >= env.max_turns:
            break
        for c in calls:
            name = c["function"]["name"]
            result = await box.call(name, c["function"].get("arguments") or "")
            messages.append({"role": "tool", "tool_call_id": c["id"], "name": name, "content": result})
    return messages


def episode_client(base_url: str, session_id: str, timeout_s: float = 300.0) -> AsyncOpenAI:
    """An OpenAI client whose every request belongs to one episode (``session_id``); close it after."""
    return AsyncOpenAI(base_url=base_url, api_key="swarmrl-local", max_retries=0, timeout=timeout_s,
                       default_headers={SESSION_HEADER: session_id})


def openai_chat(client: AsyncOpenAI, *, max_turn_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                seed: int | None = None) -> ChatFn:
    """The model behind an OpenAI-compatible endpoint (``client``: see ``episode_client``); each request asks for
    at most ``max_turn_tokens`` (OpenAI's ``max_tokens``)."""

    async def chat(messages: list[Message], tools: list[Message] | None) -> Message:
        kw: dict[str, Any] = {"model": "swarmrl", "messages": messages, "max_tokens": max_turn_tokens,
                              "temperature": temperature, "top_p": top_p}
        if tools:
            kw["tools"] = tools
        if seed is not None:
            kw["seed"] = seed
        try:
            resp = await client.chat.completions.create(**kw)
        except BadRequestError as e:
            if e.code == CONTEXT_FULL:
                raise ContextFull(str(e)) from None
            raise
        m = resp.choices[0].message
        out: Message = {"role": "assistant", "content": m.content or ""}
        if m.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in m.tool_calls]
        return out

    return chat


@dataclass
class VfRow:
    prompt_ids: list[int]
    completion_ids: list[int]  # model turns and environment turns, in order
    mask: list[int]  # 1: sampled by the model, 0: the environment's
    logprobs: list[float]  # the sampled tokens' (0 at environment tokens)
    messages: list[Message]
    reward: float
    hidden: list[Any] | None = None  # per model turn, the backend's final-norm states (capture_hidden)


async def rollout(env: VerifiersEnv, task: Task, served: Any, *, max_turn_tokens: int, temperature: float = 1.0,
                  top_p: float = 1.0, seed: int | None = None) -> VfRow:
    """One episode against ``served`` (a ``ServedEndpoint``: ``base_url`` and its ``endpoint.pop_episode``)."""
    sid = uuid.uuid4().hex
    try:
        async with episode_client(served.base_url, sid) as client:
            chat = openai_chat(client, max_turn_tokens=max_turn_tokens, temperature=temperature, top_p=top_p,
                               seed=seed)
            messages = await run_episode(env, task, chat)
    finally:
        ep = served.endpoint.pop_episode(sid)
    if ep is None or not ep.turns:
        raise RuntimeError(f"the endpoint holds no episode {sid}")
    reward = await env.ascore(task, messages)
    return VfRow(ep.prompt_ids, ep.ids, ep.mask, ep.logprobs, messages, reward, ep.hidden or None)


class _Replay(Exception):
    pass


def _scripted(turns: Sequence[list[int]], tokenizer: Any, ep: EpisodeTokens, limit: int) -> ChatFn:
    """A model that answers with the row's model turns, in order, while ``ep`` derives the ids."""

    async def chat(messages: list[Message], tools: list[Message] | None) -> Message:
        k, snap = ep.turns, ep.snapshot()
        try:
            prompt = ep.extend(tokenizer, messages, tools)
        except ChatError as e:
            raise _Replay(f"model turn {k}: {e}") from None
        if len(prompt) > limit:
            if k < len(turns):
                raise _Replay(f"model turn {k}'s prompt is {len(prompt)} tokens, over max_context_tokens {limit}")
            ep.restore(snap)  # as the endpoint does: the refused request's tokens are not the row's
            raise ContextFull
        if k >= len(turns):
            raise _Replay(f"the environment asks for model turn {k}; the row has {len(turns)}")
        message = parse_assistant(decode_completion(tokenizer, turns[k]), k)
        ep.reply(turns[k], [0.0] * len(turns[k]), message)
        return message

    return chat


def _first_difference(ep: EpisodeTokens, completion_ids: Sequence[int], mask: Sequence[int]) -> str:
    got, want = list(completion_ids), ep.ids
    for k, seg in enumerate(segments(ep.mask)):
        if got[seg.start:seg.end] != want[seg.start:seg.end] or list(mask[seg.start:seg.end]) != ep.mask[seg.start:seg.end]:
            return f"{'model' if seg.model else 'environment'} segment {k} is not what the environment replays"
    return f"the row has {len(got)} completion tokens, the replay {len(want)}"


async def _replay(env: VerifiersEnv, task: Task, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                  mask: Sequence[int], tokenizer: Any) -> tuple[str | None, list[Message]]:
    """What is wrong with a row's tokens (None: they replay), and the replayed conversation."""
    if len(mask) != len(completion_ids):
        return f"{len(mask)} mask values for {len(completion_ids)} tokens", []
    segs = segments(mask)
    if not segs or not segs[0].model or not segs[-1].model:
        return "the row must start and end with a model turn", []
    turns = [list(completion_ids[s.start:s.end]) for s in segs if s.model]
    ep = EpisodeTokens()
    try:
        messages = await run_episode(env, task, _scripted(turns, tokenizer, ep, env.max_context_tokens))
    except (_Replay, ValueError) as e:  # ValueError: the row's task is not one of this environment's
        return str(e), []
    if ep.turns != len(turns):
        return f"the episode ends after {ep.turns} model turns; the row has {len(turns)}", messages
    if ep.prompt_ids != list(prompt_ids):
        return "the prompt is not the chat template's rendering of the task's messages", messages
    if ep.ids != list(completion_ids) or ep.mask != list(mask):
        return _first_difference(ep, completion_ids, mask), messages
    return None, messages


async def areplay_problem(env: VerifiersEnv, task: Task, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                          mask: Sequence[int], tokenizer: Any, reward: float | None = None,
                          tolerance: float = 1e-6) -> str | None:
    """What is wrong with a row of ``task`` (None: it replays); see the module docstring."""
    problem, messages = await _replay(env, task, prompt_ids, completion_ids, mask, tokenizer)
    if problem is None and reward is not None:
        want = await env.ascore(task, messages)
        if abs(want - reward) > tolerance:
            return f"reward {reward} claimed, {want} recomputed"
    return problem


def replay_problem(env: VerifiersEnv, task: Task, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                   mask: Sequence[int], tokenizer: Any, reward: float | None = None,
                   tolerance: float = 1e-6) -> str | None:
    return run_sync(areplay_problem(env, task, prompt_ids, completion_ids, mask, tokenizer, reward, tolerance))


def replay_row(env: VerifiersEnv, task: Task, prompt_ids: Sequence[int], completion_ids: Sequence[int],
               mask: Sequence[int], tokenizer: Any) -> tuple[str | None, str]:
    """The validator's replay: what is wrong (None: it replays) and the conversation text ``verify`` scores."""
    problem, messages = run_sync(_replay(env, task, prompt_ids, completion_ids, mask, tokenizer))
    return problem, conversation_text(env.initial_messages(task), messages) if problem is None else ""


@dataclass
class EpisodeBatch:
    """``sample_episodes``'s output, in the sampler's shape (one entry per episode)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    masks: list[list[int]]
    texts: list[str]  # what ``verify`` scores: the conversation after the task's messages
    hidden: list[list[Any]] | None = None  # per episode, per model turn: final-norm states (capture_hidden)


def sample_episodes(backend: Any, tokenizer: Any, env: VerifiersEnv, tasks: Sequence[Task], params: Any, *,
                    limits: ChatLimits | None = None, capture_hidden: bool = False) -> EpisodeBatch:
    """One episode per task (repeat a task for a group), all against one endpoint over ``backend`` on
    127.0.0.1, run concurrently (the backend samples one request at a time). ``params``: SamplingParams, its
    ``max_turn_tokens`` per model turn (the verifiers environment bounds the episode: its turns and context)."""
    limits = limits or ChatLimits(max_turn_tokens=params.max_turn_tokens, max_prompt_tokens=env.max_context_tokens)

    async def run_all(served: ServedEndpoint) -> list[VfRow]:
        gate = asyncio.Semaphore(min(limits.max_in_flight, limits.max_episodes))  # under the endpoint's 429s

        async def one(t: Task) -> VfRow:
            async with gate:
                return await rollout(env, t, served, max_turn_tokens=params.max_turn_tokens,
                                     temperature=params.temperature, top_p=params.top_p)

        return list(await asyncio.gather(*[one(t) for t in tasks]))

    with ServedEndpoint(ChatEndpoint(backend, tokenizer, limits, capture_hidden=capture_hidden)) as served:
        rows = run_sync(run_all(served))
    eos = getattr(tokenizer, "eos_token_id", None)
    return EpisodeBatch([r.prompt_ids for r in rows], [r.completion_ids for r in rows], [r.logprobs for r in rows],
                        [bool(r.completion_ids) and r.completion_ids[-1] == eos for r in rows],
                        [r.mask for r in rows],
                        [conversation_text(env.initial_messages(t), r.messages) for t, r in zip(tasks, rows)],
                        [r.hidden or [] for r in rows] if capture_hidden else None)
