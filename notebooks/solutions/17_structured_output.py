"""Solutions to notebook 17's exercises."""

import re

import numpy as np


def my_unpack(row, vocab):
    """Shift each int32 word right by 0..31 and keep the low bit: [words, 32] bits, read row-major, cut to vocab."""
    bits = (np.asarray(row, np.int32)[:, None] >> np.arange(32)) & 1
    return bits.reshape(-1)[:vocab].astype(bool)


def my_mask_logits(logits, allowed):
    """Forbidden tokens get -inf: softmax gives them probability 0 and argmax never picks them."""
    return np.where(allowed, logits, -np.inf)


def my_choice_regex(options):
    """One alternative per option, each escaped so "." or "+" mean themselves, the whole in a group."""
    return "(" + "|".join(re.escape(o) for o in options) + ")"
