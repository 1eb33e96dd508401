"""Corpora of documents as llm.c-format token shards: the documents (documents.py), the shard file
(shards.py), the streaming, parallel prepare (prepare.py, with progress.py) and the shards opened for
training (prepared.py)."""
