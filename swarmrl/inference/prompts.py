"""Turning task prompts into token ids for a model (raw text for tiny models, chat template for chat models)."""

from __future__ import annotations


def encode_prompt(tokenizer, text: str, chat_template: bool = False) -> list[int]:
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat_template=true but the tokenizer has no chat template")
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode_completion(tokenizer, ids: list[int]) -> str:
    """The completion text a verifier sees: decoded up to (not including) the first EOS."""
    eos = tokenizer.eos_token_id
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return tokenizer.decode(ids, skip_special_tokens=True)


def encode_reply(tokenizer, text: str) -> list[int]:
    """A multi-turn environment's reply as the tokens appended to a trajectory: its text tokenized once, alone,
    without special tokens (the sampler and the validator's replay both use this)."""
    return list(tokenizer.encode(text, add_special_tokens=False))
