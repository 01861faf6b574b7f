"""Retrieval over a corpus that ships with the lab: the API documentation of the installed jax, flax and numpy
(:mod:`.corpus`), an exact dense index over the sentence encoder's embeddings and a BM25 baseline (:mod:`.index`),
the hand-written question set and its metrics (:mod:`.evaluate`)."""
