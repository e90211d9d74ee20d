"""A byte-level tokenizer built locally with the ``tokenizers`` library.

No hub is reachable, so tiny models ship with a tokenizer we build here: a byte-level BPE with
the 256 byte symbols and no merges (one token per byte, so every string round-trips) plus the
special tokens <pad>, <bos>, <eos>, <unk>. Byte-level BPE is the format Qwen2/Llama-3 tokenizers
use, so ``AutoTokenizer.from_pretrained`` reloads it faithfully whichever tokenizer class it picks
for the model type (a WordLevel char tokenizer is silently rebuilt as ByteLevel by Qwen2Tokenizer
and loses whitespace).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]


def build_char_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + byte_symbols)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
