"""Corpora, tokenizers and batches."""
