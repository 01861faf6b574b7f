"""Solutions to the exercises of notebooks/00_setup.ipynb."""

import os


def device_env(n, base):
    """A copy of ``base`` in which XLA simulates ``n`` CPU devices (set before jax starts)."""
    flag = "--xla_force_host_platform_device_count"
    others = [f for f in base.get("XLA_FLAGS", "").split() if not f.startswith(flag)]
    env = dict(base)
    env["XLA_FLAGS"] = " ".join(others + [f"{flag}={n}"])
    env["JAX_PLATFORMS"] = "cpu"  # the flag multiplies the host (CPU) platform only
    return env


def chat_ids(tokenizer, question):
    """Token ids of one user message through the model's chat template, ready for generation."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True)


if __name__ == "__main__":
    print(device_env(4, dict(os.environ))["XLA_FLAGS"])
