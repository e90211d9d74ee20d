"""Shared by the chat endpoint's and the verifiers environments' tests: a chat template that re-tokenizes a
conversation differently from the ids a model sampled, ids spelled byte by byte, a backend that samples scripted
turns."""

from __future__ import annotations

import textwrap

from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.sampler import SampleOutput

# renders an assistant turn's text, then its tool calls as JSON (spaced as tojson spaces them: the model's own
# spacing is not kept), then <eos> as text: the special token when encoded again
TEMPLATE = textwrap.dedent("""\
    {%- if tools %}<|tools|>{{ tools | tojson }}<eos>
    {% endif -%}
    {%- for m in messages -%}
    <|{{ m.role }}|>{{ m.content }}
    {%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif -%}
    <eos>
    {% endfor -%}
    {%- if add_generation_prompt %}<|assistant|>{% endif -%}""")


def byte_ids(tok, text: str) -> list[int]:
    """``text``'s bytes as the model could sample them, one token each (never merged into a special token)."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


class ScriptedBackend(InferenceBackend):
    """Samples the given turns in order (cut at max_new_tokens), with made-up logprobs; records its prompts."""

    name = "scripted"

    def __init__(self, turns: list[list[int]], eos_id: int, pad_id: int) -> None:
        super().__init__(eos_id, pad_id)
        self.turns, self.prompts, self.sampled = list(turns), [], []

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):  # noqa: ANN001, ANN201
        ids = self.turns.pop(0)[: params.max_new_tokens]
        self.prompts.append(list(prompt_ids[0]))
        self.sampled.append(ids)
        lps = [-0.5 - 0.01 * k for k in range(len(ids))]
        return SampleOutput([list(prompt_ids[0])], [ids], [lps], [bool(ids) and ids[-1] == self.eos_id])

    def update_weights(self, weights):  # noqa: ANN001, ANN201
        raise NotImplementedError
