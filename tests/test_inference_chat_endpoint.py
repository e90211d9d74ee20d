"""The OpenAI-compatible chat endpoint (``swarmrl.inference.openai_server``) and its token-in/token-out episodes
(``swarmrl.inference.chat_tokens``): the ids a later turn trains on are the ids sampled before, never the text
re-tokenized; bad requests get 4xx and the endpoint keeps serving. No verifiers needed (``tests/test_envs_vf.py``
runs episodes of verifiers environments through it)."""

from __future__ import annotations

import httpx
import pytest

from swarmrl.inference.chat_tokens import SESSION_HEADER, ChatError, EpisodeTokens, encode_text, parse_assistant, render
from swarmrl.inference.openai_server import ChatEndpoint, ChatLimits, ServedEndpoint
from swarmrl.models import load_tokenizer
from tests.chat_support import TEMPLATE, ScriptedBackend, byte_ids


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    t = load_tokenizer(tiny_model_dir)
    t.chat_template = TEMPLATE
    return t


# ---- the endpoint's bounds ---------------------------------------------------------------------------------------
def test_bad_requests_get_4xx_and_the_endpoint_keeps_serving(tok):
    backend = ScriptedBackend([byte_ids(tok, "hi") + [tok.eos_token_id]] * 3, tok.eos_token_id, tok.pad_token_id)
    limits = ChatLimits(max_body_bytes=4096, max_messages=4, max_turn_tokens=16, max_prompt_tokens=300)
    user = [{"role": "user", "content": "hello"}]
    with ServedEndpoint(ChatEndpoint(backend, tok, limits)) as served:
        url = served.base_url + "/chat/completions"
        with httpx.Client(timeout=30) as c:
            bad = [
                c.post(url, content=b"{not json"),
                c.post(url, json={"messages": []}),
                c.post(url, json={"messages": "hi"}),
                c.post(url, json={"messages": user, "n": 2}),
                c.post(url, json={"messages": user, "stream": True}),
                c.post(url, json={"messages": user, "max_tokens": 10_000}),
                c.post(url, json={"messages": user * 5}),
                c.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}),
                c.post(url, json={"messages": [{"role": "user", "content": {"a": 1}}]}),
                c.post(url, json={"messages": [{"role": "user", "content": "x" * 3000}]}),  # prompt over 300 tokens
                c.post(url, content=b"{" + b" " * 5000 + b"}"),  # body over 4096 bytes
                c.post(url, json={"messages": user, "temperature": -1}),
                c.post(url, content=b"[" * 2000 + b"]" * 2000),  # nested too deep for the JSON parser
                c.post(url, json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                c.post(url, json={"messages": [{"role": "assistant", "content": "x", "tool_calls": "zz"}, *user]}),
            ]
            assert [r.status_code for r in bad] == [400, 422, 422, 400, 400, 400, 400, 400, 400, 400, 413, 422,
                                                    400, 400, 400]
            assert all("error" in r.json() for r in bad)
            refused = c.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}, headers={SESSION_HEADER: "bad"})
            assert refused.status_code == 400 and not served.endpoint._episodes  # refused: nothing kept
            ok = c.post(url, json={"messages": user, "logprobs": True}, headers={SESSION_HEADER: "ep1"})
            assert ok.status_code == 200, ok.text
            body = ok.json()
            assert body["choices"][0]["message"]["content"] == "hi"
            assert body["choices"][0]["token_ids"] == byte_ids(tok, "hi") + [tok.eos_token_id]
            assert len(body["choices"][0]["logprobs"]["content"]) == 3 and body["prompt_token_ids"]
            # a next request must extend the episode's conversation
            assert c.post(url, json={"messages": [{"role": "user", "content": "other"}]},
                          headers={SESSION_HEADER: "ep1"}).status_code == 400
            convo = [*user, body["choices"][0]["message"], {"role": "user", "content": "again"}]
            assert c.post(url, json={"messages": convo}, headers={SESSION_HEADER: "ep1"}).status_code == 200
        ep = served.endpoint.pop_episode("ep1")
        assert ep.turns == 2 and ep.mask.count(1) == 6 and 0 in ep.mask
        assert served.endpoint.pop_episode("ep1") is None


def test_the_endpoint_holds_a_bounded_number_of_episodes_and_one_request_per_episode_at_a_time(tok):
    import threading

    gate = threading.Event()

    class Slow(ScriptedBackend):
        def generate(self, *a, **kw):  # noqa: ANN002, ANN003, ANN201
            gate.wait(10)
            return super().generate(*a, **kw)

    backend = Slow([byte_ids(tok, "x") + [tok.eos_token_id]] * 2, tok.eos_token_id, tok.pad_token_id)
    user = {"messages": [{"role": "user", "content": "hi"}]}
    with ServedEndpoint(ChatEndpoint(backend, tok, ChatLimits(max_episodes=1))) as served:
        url = served.base_url + "/chat/completions"
        with httpx.Client(timeout=30) as c:
            t = threading.Thread(target=lambda: c.post(url, json=user, headers={SESSION_HEADER: "a"}))
            t.start()
            for _ in range(200):  # the first request holds its episode while it samples
                if served.endpoint._busy:
                    break
                threading.Event().wait(0.01)
            assert c.post(url, json=user, headers={SESSION_HEADER: "a"}).status_code == 409
            assert c.post(url, json=user, headers={SESSION_HEADER: "b"}).status_code == 429
            gate.set()
            t.join()
            assert served.endpoint.pop_episode("a").turns == 1
            assert c.post(url, json=user, headers={SESSION_HEADER: "b"}).status_code == 200


def test_token_in_token_out_keeps_the_sampled_ids_where_the_text_would_tokenize_otherwise(tok):
    """Turn 1 samples "<eos>" spelled byte by byte and half of a UTF-8 character: decoded and encoded again, those
    are one special token and the 3 bytes of U+FFFD. The next request's prompt keeps the sampled ids."""
    half = tok.encode("é", add_special_tokens=False)[:1]
    turn1 = byte_ids(tok, "a<eos>b") + half + [tok.eos_token_id]
    turn2 = byte_ids(tok, "done") + [tok.eos_token_id]
    backend = ScriptedBackend([turn1, turn2], tok.eos_token_id, tok.pad_token_id)
    convo = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    with ServedEndpoint(ChatEndpoint(backend, tok, ChatLimits(max_turn_tokens=64))) as served, \
            httpx.Client(timeout=30) as c:
        url, head = served.base_url + "/chat/completions", {SESSION_HEADER: "e"}
        r1 = c.post(url, json={"messages": convo, "logprobs": True}, headers=head).json()
        assert r1["choices"][0]["token_ids"] == turn1
        convo += [r1["choices"][0]["message"], {"role": "user", "content": "more"}]
        r2 = c.post(url, json={"messages": convo}, headers=head).json()
        ep = served.endpoint.pop_episode("e")
    p1, p2 = r1["prompt_token_ids"], r2["prompt_token_ids"]
    assert p2[: len(p1) + len(turn1)] == p1 + turn1  # the sampled ids, as they are
    new = encode_text(tok, render(tok, convo, None, True)[len(render(tok, convo[:3], None, False)):])
    assert p2 == p1 + turn1 + new  # then only the new message's tokens
    assert ep.prompt_ids == p1 and ep.ids == turn1 + new + turn2
    assert ep.mask == [1] * len(turn1) + [0] * len(new) + [1] * len(turn2)
    assert ep.logprobs[: len(turn1)] == [x["logprob"] for x in r1["choices"][0]["logprobs"]["content"]]
    # what re-rendering and re-tokenizing the conversation would have trained on instead
    redone = encode_text(tok, render(tok, [*convo, r2["choices"][0]["message"]], None, False))
    assert redone != ep.prompt_ids + ep.ids
    assert r1["choices"][0]["message"]["content"] == "a<eos>b\ufffd"


def test_a_conversation_the_template_renders_otherwise_once_it_goes_on_is_refused(tok):
    ep = EpisodeTokens()
    forgetful = ("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<|{{ m.role }}|>{{ m.content }}"
                 "<eos>{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    old = tok.chat_template
    tok.chat_template = forgetful
    try:
        ep.extend(tok, [{"role": "user", "content": "q"}], None)
        ep.reply(byte_ids(tok, "a"), [-1.0], {"role": "assistant", "content": "a"})
        with pytest.raises(ChatError, match="renders the earlier conversation differently"):
            ep.extend(tok, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                            {"role": "user", "content": "q2"}], None)
    finally:
        tok.chat_template = old
    with pytest.raises(ChatError, match="last message"):
        EpisodeTokens().extend(tok, [{"role": "assistant", "content": "x"}], None)


def test_tool_calls_are_parsed_from_the_hermes_format():
    m = parse_assistant('let me <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', 3)
    assert m["content"] == "let me"
    assert m["tool_calls"] == [{"id": "call_3_0", "type": "function",
                                "function": {"name": "add", "arguments": '{"a": 1}'}}]
    assert parse_assistant("<tool_call>{bad json</tool_call>", 0) == {
        "role": "assistant", "content": "<tool_call>{bad json</tool_call>"}
    assert "tool_calls" not in parse_assistant('<tool_call>["x"]</tool_call>', 0)
