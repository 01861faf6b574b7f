"""One place for jaxlab's error types.

Every error a user can cause (a bad file, a wrong shape, a prompt that is too long, an invalid request)
is raised as a subclass of :class:`JaxlabError` with a message that names the problem and says what to
do. The CLI prints ``str(error)`` on one line and exits non-zero; nothing deep inside JAX leaks out.
"""

from __future__ import annotations


class FallbackWarning(UserWarning):
    """Something asked for cannot run on this machine, and a slower path that gives the same result runs instead
    (one sentence: what, why, what runs). The CLI prints it as ``jaxlab: note: ...``."""


class JaxlabError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class ModelFileError(JaxlabError):
    """A model file is missing, empty, truncated, corrupt, foreign or unsupported."""


class ConfigError(JaxlabError):
    """A configuration or parameter tree does not fit the model (wrong shape, unknown preset...)."""


class InvalidRequestError(JaxlabError):
    """A generation request has an invalid value (negative token count, temperature out of range...). ``param``
    names the request's field at fault (``prompt``, ``max_new_tokens``, ``top_logprobs``...) and ``code`` a kind a
    face may report (``context_length_exceeded``), so the server can answer with the field its client sent."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class PromptTooLongError(InvalidRequestError):
    """Prompt plus requested new tokens do not fit in the model's context."""

    def __init__(self, message: str, param: str = "prompt", code: str | None = "context_length_exceeded"):
        super().__init__(message, param, code)


class ExportError(JaxlabError):
    """A model cannot be written as asked: quantized parameters, an unknown format or type, an output in the way."""


class AssetError(JaxlabError):
    """The embedded model cannot be found or fails its checksum."""
