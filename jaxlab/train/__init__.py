"""Fine-tuning: LoRA adapters trained with ``jax.grad`` and optax, on the model's own forward pass.

* :mod:`~jaxlab.train.lora` — the adapters (:class:`~jaxlab.train.lora.LoraKernel` in the linear-layer hook), apply,
  merge, save and load;
* :mod:`~jaxlab.train.data` — prompt/answer examples -> chat-templated token batches with the loss on the answer;
* :mod:`~jaxlab.train.step` — the loss, the optax optimizer (AdamW, warm-up + cosine, clipping), the jitted step;
* :mod:`~jaxlab.train.finetune` — the run: progress, checkpoints that resume exactly, validation, evaluation;
* :mod:`~jaxlab.train.task` — the shipped task (sentences -> strict JSON) and its scoring;
* :mod:`~jaxlab.train.command` — ``jaxlab finetune``.

The train package sits above the engine: it imports :mod:`jaxlab.engine`, never the other way round.
"""
