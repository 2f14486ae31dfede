"""The model and data of the integration tests (tests/test_integrations_*.py): BERT-tiny's shape from a config and a
64-example synthetic masked-LM dataset, nothing downloaded."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForMaskedLM


def bert_tiny() -> BertForMaskedLM:
    """BERT-tiny's shape (2 layers, hidden 128, 2 heads) from a config with a small vocabulary: random weights."""
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512,
                        vocab_size=128, max_position_embeddings=64)
    return BertForMaskedLM(config)


def synthetic_dataset(size: int = 64, length: int = 32) -> list[dict[str, torch.Tensor]]:
    """Masked-LM examples: random ids, an attention mask with the tail padded, labels -100 outside 1 in 4 tokens."""
    generator = torch.Generator().manual_seed(1)
    examples = []
    for index in range(size):
        ids = torch.randint(0, 128, (length,), generator=generator)
        mask = torch.ones(length, dtype=torch.long)
        mask[length - index % 8:] = 0
        labels = torch.where(torch.rand(length, generator=generator) < 0.25, ids, torch.full_like(ids, -100))
        examples.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return examples
