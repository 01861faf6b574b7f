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


class PromptTooLongError(JaxlabError):
    """Prompt plus requested new tokens do not fit in the model's context."""


class InvalidRequestError(JaxlabError):
    """A generation request has an invalid value (negative token count, temperature out of range...)."""


class ExportError(JaxlabError):
    """A model cannot be written as asked: quantized parameters, an unknown format or type, an output in the way."""


class AssetError(JaxlabError):
    """The embedded model cannot be found or fails its checksum."""
