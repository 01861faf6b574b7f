"""jaxlab: a JAX/Flax LLM-inference lab on a real pretrained model, where every speed claim is measured.

Data flows one way: a model name or file -> ``jaxlab.io`` (assets: fetch, checksum, cache; GGUF / Hugging
Face readers -> parameter tree; tokenizer) -> ``jaxlab.engine`` (config, the model's one ``forward``,
KV cache, sampling; the step toolkit: plan, programs, steps; generation, speculative decoding,
sharding; ``loading`` is the one door from files to parameters) -> the faces: ``cli``, ``bench``, the
notebooks. Beside the flow: ``jaxlab.quant`` (plugs into the engine's linear layers through one hook),
``jaxlab.tools`` (profile, compile cache, export, reference, hardware) and ``jaxlab.lab`` (what only the
notebooks need). This module re-exports the names most programs start from.
"""

from jaxlab.tools.hardware import keep_jax_off_a_missing_tpu

keep_jax_off_a_missing_tpu()  # libtpu without a TPU (installed to compile for one): jax goes to the CPU quietly

from jaxlab.engine.generate import GenerationResult, Generator, decode_on_device  # noqa: E402
from jaxlab.engine.kvcache import KVCache, init_cache  # noqa: E402
from jaxlab.engine.loading import Model, load  # noqa: E402
from jaxlab.engine.model import Llama, Params, Policy, default_policy, forward, init_params  # noqa: E402
from jaxlab.engine.sampling import SamplingParams  # noqa: E402
from jaxlab.errors import AssetError, ConfigError, InvalidRequestError, JaxlabError, ModelFileError, PromptTooLongError  # noqa: E402
from jaxlab.io.config import LlamaConfig, smollm2_135m, smollm2_360m, tiny  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "LlamaConfig",
    "smollm2_135m",
    "smollm2_360m",
    "tiny",
    "AssetError",
    "ConfigError",
    "InvalidRequestError",
    "JaxlabError",
    "ModelFileError",
    "PromptTooLongError",
    "GenerationResult",
    "Generator",
    "decode_on_device",
    "KVCache",
    "init_cache",
    "Model",
    "load",
    "Llama",
    "Params",
    "Policy",
    "default_policy",
    "forward",
    "init_params",
    "SamplingParams",
]
