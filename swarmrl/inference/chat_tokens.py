"""Token-in/token-out chat episodes: the token ids of a conversation that a chat endpoint serves turn by turn.

An episode is one conversation (one ``X-Session-ID``). Its first request's messages are rendered with the
tokenizer's chat template (generation prompt added) and tokenized once: the prompt ids. Each model turn appends
the ids the model sampled, as they are (mask 1, with their logprobs). A later request must extend the episode's
conversation (the earlier messages, the assistant replies as the endpoint returned them, then new messages: tool
results, a user turn); only the new messages are tokenized: the text the template renders after the earlier
conversation (``render(all, generation prompt)`` minus its prefix ``render(earlier, no generation prompt)``),
appended with mask 0. The model's sampled ids are never decoded and re-encoded, so the row trains on exactly the
ids that were sampled, whatever the tokenizer would make of their text.

A template that renders an earlier turn differently once the conversation goes on (one that drops earlier
reasoning, say) has no such prefix: ``ChatError`` says so. The validator replays an episode with the same rule
(``EpisodeTokens.extend``), so what it derives is what the endpoint appended.

Tool calls are read from a model turn's text in the Hermes format (``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, what Qwen-style templates render back); ``parse_assistant`` is the one parser both sides use.
Nothing here imports torch or a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
SESSION_HEADER = "X-Session-ID"  # an episode's id on every request (verifiers.v1's SESSION_ID_HEADER)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
MAX_TOOL_CALLS = 8  # per model turn; more are left in the text, unparsed


class ChatError(ValueError):
    """A request this episode cannot serve: the message says why (the endpoint answers 4xx with it)."""


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ChatError("only text content parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise ChatError(f"message content must be a string or a list of text parts, not {type(content).__name__}")


def canonical(message: Message) -> Message:
    """The fields of a message that the template renders, in one form (what "extends" compares)."""
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ChatError(f"unsupported message role {role!r}")
    out: Message = {"role": role, "content": content_text(message.get("content"))}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = [_canonical_call(c) for c in calls]
    if role == "tool":
        out["tool_call_id"] = str(message.get("tool_call_id") or "")
        if message.get("name"):
            out["name"] = str(message["name"])
    return out


def _canonical_call(call: Any) -> Message:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ChatError("a tool call must be {'id', 'type': 'function', 'function': {'name', 'arguments'}}")
    fn = call["function"]
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args)
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": str(fn.get("name", "")), "arguments": args}}


def parse_assistant(text: str, turn: int) -> Message:
    """The assistant message of a model turn's text: Hermes tool calls taken out (ids ``call_<turn>_<k>``)."""
    calls: list[Message] = []
    for k, m in enumerate(TOOL_CALL_RE.finditer(text)):
        if k >= MAX_TOOL_CALLS:
            break
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        calls.append({"id": f"call_{turn}_{k}", "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(args)}})
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": TOOL_CALL_RE.sub("", text).strip(), "tool_calls": calls}


def _template_messages(messages: Sequence[Message]) -> list[Message]:
    """Messages as HF chat templates take them: tool-call arguments as objects (Qwen's template dumps them)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {"name": c["function"]["name"],
                                                  "arguments": _loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def render(tokenizer: Any, messages: Sequence[Message], tools: Sequence[Message] | None,
           generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ChatError("the tokenizer has no chat template")
    try:
        text = tokenizer.apply_chat_template(_template_messages(messages), tools=list(tools) if tools else None,
                                             add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as e:  # noqa: BLE001  # a template error (jinja raise_exception) is the request's fault
        raise ChatError(f"the chat template refused the messages: {e}") from None
    if not isinstance(text, str):
        raise ChatError("the chat template did not render text")
    return text


def encode_text(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Message], tools: Sequence[Message] | None) -> list[int]:
    """An episode's prompt: the messages rendered with the generation prompt, tokenized once."""
    return encode_text(tokenizer, render(tokenizer, [canonical(m) for m in messages], tools, True))


@dataclass
class EpisodeTokens:
    """One episode's ids so far: ``prompt_ids``, then ``ids`` (model turns mask 1, environment turns mask 0)."""

    tools: list[Message] | None = None
    messages: list[Message] = field(default_factory=list)  # canonical, the assistant replies included
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0  # model turns taken
    hidden: list[Any] = field(default_factory=list)  # per model turn, what the backend captured (final-norm states)

    def extend(self, tokenizer: Any, messages: Sequence[Message], tools: Sequence[Message] | None) -> list[int]:
        """Take a request's messages: append the new messages' ids (mask 0) and return the whole prompt for the
        next model turn. ChatError when they do not extend this episode's conversation."""
        msgs = [canonical(m) for m in messages]
        if not msgs or msgs[-1]["role"] == "assistant":
            raise ChatError("the last message must not be an assistant message")
        tools = [dict(t) for t in tools] if tools else None
        if self.turns == 0:
            self.tools, self.messages = tools, msgs
            self.prompt_ids = chat_prompt_ids(tokenizer, msgs, tools)
            return list(self.prompt_ids)
        if tools != self.tools:
            raise ChatError("the tools differ from the episode's first request")
        n = len(self.messages)
        if msgs[:n] != self.messages or len(msgs) == n:
            raise ChatError("the messages do not extend the episode's conversation (the earlier messages and "
                            "the assistant replies as returned, then new ones)")
        before = render(tokenizer, self.messages, tools, False)
        after = render(tokenizer, msgs, tools, True)
        if not after.startswith(before):
            raise ChatError("the chat template renders the earlier conversation differently once it goes on, "
                            "so the new messages' tokens cannot be appended")
        new = encode_text(tokenizer, after[len(before):])
        self.messages = msgs
        self.add(new, [0.0] * len(new), model=False)
        return self.prompt_ids + self.ids

    def snapshot(self) -> tuple:
        return list(self.messages), len(self.ids), self.tools, list(self.prompt_ids), self.turns

    def restore(self, snap: tuple) -> None:
        """Undo what came after ``snapshot`` (a request that was not served: a retry extends the same state)."""
        messages, n, tools, prompt_ids, turns = snap
        self.messages, self.tools, self.prompt_ids, self.turns = messages, tools, prompt_ids, turns
        del self.ids[n:], self.mask[n:], self.logprobs[n:]

    def add(self, ids: Sequence[int], logprobs: Sequence[float], model: bool) -> None:
        self.ids += list(ids)
        self.logprobs += list(logprobs)
        self.mask += [1 if model else 0] * len(ids)

    def reply(self, ids: Sequence[int], logprobs: Sequence[float], message: Message) -> None:
        """Record a model turn: its sampled ids as they are, and the assistant message the endpoint returns."""
        self.add(ids, logprobs, model=True)
        self.messages.append(canonical(message))
        self.turns += 1
