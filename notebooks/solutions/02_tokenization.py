"""Solutions to the exercises of notebook 02 (tokenization)."""

import numpy as np


def count_pairs(ids):
    """How often each adjacent pair occurs; overlapping pairs count: [a, a, a] has (a, a) twice."""
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids, pair, new_id):
    """Replace each occurrence of ``pair`` by ``new_id``, scanning left to right: [a, a, a] -> [Z, a]."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def left_pad(batch, pad_id):
    """-> (ids [B, T], mask [B, T]): each row right-aligned, pad_id on the left, mask True on real tokens."""
    length = max(len(s) for s in batch)
    ids = np.full((len(batch), length), pad_id, dtype=np.int32)
    mask = np.zeros((len(batch), length), dtype=bool)
    for row, seq in enumerate(batch):
        if seq:
            ids[row, -len(seq):] = seq
            mask[row, -len(seq):] = True
    return ids, mask
