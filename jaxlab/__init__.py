"""jaxlab: a JAX/Flax LLM-inference lab on a real pretrained model, where every speed claim is measured.

Data flows one way: a model name or file -> ``assets`` (fetch, checksum, cache) -> ``weights``
(GGUF / Hugging Face files -> parameter tree) -> ``loading`` (one door: config, params, tokenizer)
-> ``model`` (Flax NNX; ``forward(params, tokens, positions, cache)``) with ``kvcache`` and ``config``
below it -> ``generate`` (prefill + decode, ``sampling``) -> the faces: ``cli``, notebooks.
Beside the flow: ``profile`` (timing, compile counting, roofline), ``reference`` (transformers parity).
"""

from jaxlab.engine.config import LlamaConfig, smollm2_135m, smollm2_360m, tiny
from jaxlab.engine.generate import GenerationResult, Generator, decode_on_device
from jaxlab.engine.kvcache import KVCache, init_cache
from jaxlab.engine.loading import Model, load
from jaxlab.engine.model import Llama, Params, Policy, default_policy, forward, init_params
from jaxlab.engine.sampling import SamplingParams
from jaxlab.errors import AssetError, ConfigError, InvalidRequestError, JaxlabError, ModelFileError, PromptTooLongError

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
