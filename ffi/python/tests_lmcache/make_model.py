"""Builds a tiny Llama in a folder, with no model hub: random weights and a
byte-level BPE tokenizer trained on a few sentences. Enough for a real vLLM
engine to load, fill its KV cache and generate (nonsense, deterministically).

Usage: ``make_model.py FOLDER``.
"""

from __future__ import annotations

import sys
from pathlib import Path

SENTENCES = [
    "A worker beats by writing a timestamp into its own slot of a shared table.",
    "The reaper scans the table and ends the registrations that went silent.",
    "When an engine crashes, the server frees the KV cache it held for it.",
    "Liveness without a round trip: no syscall, no message, no server thread woken.",
] * 8


def main(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)

    torch.manual_seed(0)
    # head size 64: the CPU attention kernels take 32, 64, 80, 96, 112, 128 and 256, not 16.
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
