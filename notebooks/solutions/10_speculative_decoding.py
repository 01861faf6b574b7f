"""Solutions to notebook 10's exercises."""

import numpy as np


def my_ngram_propose(context, k):
    """Prompt lookup: find the last n-gram (n = 3, 2, 1) earlier in the context, propose what followed."""
    for n in (3, 2, 1):
        if len(context) <= n:
            continue
        suffix = context[-n:]
        # most recent earlier start s whose n-gram is followed by at least one token (s + n < len)
        for s in range(len(context) - n - 1, -1, -1):
            if context[s:s + n] == suffix:
                follow = context[s + n:s + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return []


def my_accepted_count(drafts, target):
    """Per row: how many leading drafts equal the target model's tokens."""
    same = np.asarray(drafts) == np.asarray(target)[:, : np.asarray(drafts).shape[1]]
    return np.cumprod(same, axis=1).sum(axis=1)


def my_residual(p, q):
    """Where to draw from after a rejection: the part of p that q under-proposes, normalized."""
    r = np.maximum(np.asarray(p) - np.asarray(q), 0.0)
    return r / r.sum(axis=-1, keepdims=True)
