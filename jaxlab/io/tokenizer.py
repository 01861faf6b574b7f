"""Text <-> token ids, built at run time from the model file itself.

Byte-level BPE in three sentences
---------------------------------
1. The text is cut into *pre-tokens* by a regular expression (words with their leading space, runs of
   punctuation, runs of whitespace; SmolLM2 also cuts every digit into its own piece), so merges never
   cross a word boundary.
2. Each pre-token is turned into its UTF-8 bytes, and each byte is spelled as one printable character
   (GPT-2's trick: byte 0x20, the space, is written ``Ġ``), so every possible input has a spelling.
3. The learned *merges* are applied in rank order: the best-ranked adjacent pair is glued together,
   again and again, until no listed pair is left; each remaining piece is looked up in the vocabulary.

Decoding runs backwards: ids -> spellings -> bytes -> UTF-8 text. A token is a run of *bytes*, not of
characters, so one token can end in the middle of a multi-byte character (an emoji is 4 bytes and is
often 2 or 3 tokens). :class:`StreamDecoder` holds such half characters back while streaming.

A GGUF file carries no ``tokenizer.json``; it stores the vocabulary (``tokenizer.ggml.tokens``), the
merges, a type per token (3 = control, like ``<|im_start|>``) and the *name* of the pre-tokenizer
(``tokenizer.ggml.pre``). :meth:`Tokenizer.from_gguf` rebuilds the tokenizer from those with the
``tokenizers`` library, the way llama.cpp interprets them. (``transformers``' GGUF conversion gives the
same ids except for one detail of SmolLM2's digit splitting; see :func:`_pre_tokenizer`.)

Not every byte is in every vocabulary: SmolLM2's has no token for 21 byte values (six control
characters, 13 bytes that never occur in valid UTF-8, and the lead bytes 0xF1/0xF2 of the unassigned
code points U+40000..U+BFFFF), and the BPE model silently drops text it cannot spell, as the reference
tokenizer does. :attr:`Tokenizer.missing_bytes`
lists them; :func:`sanitize` removes the control characters before they get that far.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from jaxlab.errors import InvalidRequestError, ModelFileError

if TYPE_CHECKING:
    from jaxlab.io.gguf import GGUFFile

# llama.cpp's token types (tokenizer.ggml.token_type)
CONTROL, USER_DEFINED = 3, 4

# Pre-tokenizers by the name llama.cpp writes in `tokenizer.ggml.pre`, grouped as llama.cpp groups them.
# GPT-2's own split (built into tokenizers' ByteLevel): 's 't.. | ?letters | ?numbers | ?other | spaces
GPT2_PRETOKENIZERS = ("default", "gpt2", "mpt", "olmo", "jais")
# The same split after cutting every digit apart ("2024" -> 2 0 2 4): StarCoder's lineage, SmolLM included.
DIGITS_PRETOKENIZERS = ("smollm", "starcoder", "refact", "codeshell", "command-r")
# Llama 3: case-insensitive contractions, numbers in groups of up to three digits.
_LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SUPPORTED_PRE = GPT2_PRETOKENIZERS + DIGITS_PRETOKENIZERS + _LLAMA3_NAMES


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (256 entries).

    Printable Latin-1 bytes spell themselves; the other 68 (controls, space, soft hyphen...) are moved to
    U+0100 and up, so a token's spelling never contains whitespace or a control character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return dict(sorted(table.items()))


def _pre_tokenizer(name: str):
    """The tokenizers pre-tokenizer for llama.cpp's pre-tokenizer name, or None if unknown."""
    if name in GPT2_PRETOKENIZERS:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in DIGITS_PRETOKENIZERS:
        # llama.cpp splits these on \p{N} (every number character alone) before GPT-2's regex. Digits runs
        # on the real text, so it must come first: ByteLevel respells bytes, after which "½" is "Â½" and no
        # longer a number. (transformers' GGUF conversion omits the digit split; with ASCII digits the ids
        # are the same, but " ½" becomes "ĠÂ" + "½" there and "Ġ" + "Â½" here and in llama.cpp.)
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if name in _LLAMA3_NAMES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return None


# ---------------------------------------------------------------------------------------------------
# Reading a GGUF file's metadata
# ---------------------------------------------------------------------------------------------------

# GGUF value type -> struct format (8 = string and 9 = array are handled separately)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """All key/value metadata of a GGUF file, tokenizer arrays included; tensors are not touched.

    ``gguf.GGUFReader`` wraps every one of the ~100k vocabulary strings in its own numpy view, which
    takes about 2 s for SmolLM2; walking the header with ``struct`` takes about 0.1 s. Layout (GGUF v2/v3):
    magic, version u32, tensor count u64, kv count u64, then per kv: key string, type u32, value, where a
    string is a u64 length plus UTF-8 bytes and an array is an element type u32, a u64 count, elements."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a folder, not a GGUF file")
    if path.stat().st_size == 0:
        raise ModelFileError(f"{path} is empty (0 bytes); delete it and fetch the model again")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ModelFileError(f"{path} is not a GGUF file (it starts with {buf[:4]!r}, a GGUF file with b'GGUF')")
        # A big-endian file stores version 3 as 0x03000000, which reads as a huge little-endian number.
        end = "<" if struct.unpack_from("<I", buf, 4)[0] < 0x10000 else ">"
        (version,) = struct.unpack_from(end + "I", buf, 4)
        if version not in (2, 3):
            raise ModelFileError(f"{path}: GGUF version {version} is not supported (only versions 2 and 3)")
        pos = 24  # magic (4) + version (4) + tensor count (8) + kv count (8)

        def take(fmt: str):
            nonlocal pos
            value = struct.unpack_from(end + fmt, buf, pos)[0]
            pos += struct.calcsize(fmt)
            return value

        def string() -> str:
            nonlocal pos
            n = take("Q")
            if pos + n > len(buf):
                raise struct.error("string runs past the end of the file")
            s = buf[pos : pos + n].decode("utf-8", errors="replace")
            pos += n
            return s

        def value(kind: int):
            nonlocal pos
            if kind in _SCALARS:
                return take(_SCALARS[kind])
            if kind == 8:
                return string()
            if kind == 9:
                item, count = take("I"), take("Q")
                if item == 8:
                    return [string() for _ in range(count)]
                if item in _SCALARS:  # numbers: one numpy read instead of `count` struct calls
                    dtype = np.dtype(end + _SCALARS[item])
                    if pos + count * dtype.itemsize > len(buf):
                        raise struct.error("array runs past the end of the file")
                    arr = np.frombuffer(buf[pos : pos + count * dtype.itemsize], dtype)
                    pos += count * dtype.itemsize
                    return arr.tolist()
                return [value(item) for _ in range(count)]  # arrays of arrays
            raise ValueError(f"unknown value type {kind}")

        try:
            n_kv = struct.unpack_from(end + "Q", buf, 16)[0]
            meta = {}
            for _ in range(n_kv):
                key = string()
                meta[key] = value(take("I"))
        except (struct.error, ValueError, MemoryError) as e:
            raise ModelFileError(f"{path} is truncated or corrupt: its metadata cannot be read ({e})") from None
    return meta


# ---------------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------------


class Tokenizer:
    """A byte-level BPE tokenizer (a ``tokenizers.Tokenizer``) plus the model's special ids and chat template.

    Build it with :meth:`from_gguf` or :meth:`from_hf`."""

    def __init__(
        self,
        backend: _Backend,
        *,
        bos_id: int | None,
        eos_id: int | None,
        pad_id: int | None,
        special_ids: Sequence[int] = (),
        chat_template: str | None = None,
        source: str = "<tokenizer>",
    ):
        self.backend = backend  # the tokenizers.Tokenizer doing the work (public: handy in notebooks)
        self.source = source  # file or folder it came from, for error messages
        self._bos_id, self._eos_id, self._pad_id = bos_id, eos_id, pad_id
        self._special_ids = frozenset(int(i) for i in special_ids)
        self._chat_template = chat_template
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # ---- construction -------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: str | os.PathLike | GGUFFile) -> "Tokenizer":
        """Build from a GGUF file's metadata. ``source``: a path, or an opened ``GGUFFile`` (no re-read)."""
        if hasattr(source, "field") and hasattr(source, "path"):  # a jaxlab.io.gguf.GGUFFile
            meta = dict(source.metadata)
            for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
                if (value := source.field(key)) is not None:  # big arrays, left out of .metadata
                    meta[key] = value
            return cls._from_gguf_metadata(meta, str(source.path))
        return cls._from_gguf_metadata(read_gguf_metadata(source), str(source))

    @classmethod
    def _from_gguf_metadata(cls, meta: Mapping[str, Any], where: str) -> "Tokenizer":
        kind = meta.get("tokenizer.ggml.model")
        if kind is None:
            raise ModelFileError(
                f"{where}: the file has no tokenizer (metadata field tokenizer.ggml.model is missing); "
                "use a GGUF exported with its tokenizer, or load one with Tokenizer.from_hf(folder)"
            )
        if kind != "gpt2":
            raise ModelFileError(
                f"{where}: the tokenizer is of kind {kind!r} (tokenizer.ggml.model); jaxlab builds only "
                "byte-level BPE tokenizers ('gpt2') from GGUF files; load this model's tokenizer.json "
                "with Tokenizer.from_hf(folder)"
            )
        missing = [k for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") if not meta.get(k)]
        if missing:
            raise ModelFileError(f"{where}: the tokenizer is incomplete: metadata {', '.join(missing)} missing")
        pre_name = meta.get("tokenizer.ggml.pre", "default")
        pre = _pre_tokenizer(pre_name)
        if pre is None:
            raise ModelFileError(
                f"{where}: pre-tokenizer {pre_name!r} (tokenizer.ggml.pre) is unknown to jaxlab; "
                f"supported: {', '.join(SUPPORTED_PRE)}"
            )
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        if len(types) != len(tokens):
            raise ModelFileError(f"{where}: {len(tokens)} tokens but {len(types)} token types; the file is corrupt")

        # Every BPE token should be spelled in the byte alphabet. Some converters store a token as raw
        # text instead (with a real space, say); spell those in the alphabet so merges can reach them.
        spell = bytes_to_unicode()
        alphabet = set(spell.values())
        respelled = [t if set(t) <= alphabet else "".join(spell[b] for b in t.encode()) for t in tokens]
        vocab = {t: i for i, t in enumerate(respelled)}
        # Merges are stored as "left right"; the byte alphabet has no space, so the split is unambiguous.
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        try:
            # No unk_token: text the vocabulary cannot spell is dropped, as in the reference tokenizer.
            backend = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        except Exception as e:
            raise ModelFileError(f"{where}: the vocabulary and merges do not form a BPE tokenizer ({e})") from None
        backend.pre_tokenizer = pre
        backend.decoder = decoders.ByteLevel()

        def token_id(key: str) -> int | None:
            i = meta.get(key)
            if i is None:
                return None
            if not 0 <= int(i) < len(tokens):
                raise ModelFileError(f"{where}: {key} = {i} is outside the vocabulary (0..{len(tokens) - 1})")
            return int(i)

        bos, eos, pad = (token_id(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding"))
        # Control tokens (and bos/eos/pad) are *special*: matched whole in the input text, so
        # "<|im_start|>" in a prompt becomes id 1 instead of 6 pieces, and droppable on decode.
        # Tokens stored as raw text were respelled above; adding them here would create new ids.
        special = {i for i, ty in enumerate(types) if ty == CONTROL} | {i for i in (bos, eos, pad) if i is not None}
        special = sorted(i for i in special if tokens[i] == respelled[i])
        size = backend.get_vocab_size(with_added_tokens=True)
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
        # User-defined tokens (like "<think>") are matched whole too, but are ordinary text on decode.
        user = [AddedToken(tokens[i], special=False, normalized=False) for i, ty in enumerate(types)
                if ty == USER_DEFINED and tokens[i] == respelled[i]]  # fmt: skip
        if user:
            backend.add_tokens(user)
        if backend.get_vocab_size(with_added_tokens=True) != size:  # an added token got a new id
            raise ModelFileError(f"{where}: the special tokens do not match the vocabulary; the file is corrupt")

        # BOS/EOS around every encode(..., add_special_tokens=True), if the file asks for them.
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
        if add_bos or add_eos:
            pieces = ([tokens[bos]] if add_bos else []) + ["$A"] + ([tokens[eos]] if add_eos else [])
            used = [(tokens[i], i) for i in {bos if add_bos else None, eos if add_eos else None} if i is not None]
            backend.post_processor = processors.TemplateProcessing(single=" ".join(pieces), special_tokens=used)

        return cls(
            backend,
            bos_id=bos,
            eos_id=eos,
            pad_id=pad,
            special_ids=special,
            chat_template=meta.get("tokenizer.chat_template"),
            source=where,
        )

    @classmethod
    def from_hf(cls, folder: str | os.PathLike) -> "Tokenizer":
        """Load a Hugging Face tokenizer folder: ``tokenizer.json`` plus, if present, ``tokenizer_config.json``
        (special tokens, chat template), ``chat_template.jinja`` and ``config.json`` (fallback token ids)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelFileError(f"{folder}: no tokenizer.json in this folder (download the model's tokenizer files)")
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:
            raise ModelFileError(f"{path} cannot be read as a tokenizer: {e}") from None

        def read_json(name: str) -> dict:
            p = folder / name
            if not p.is_file():
                return {}
            try:
                return json.loads(p.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ModelFileError(f"{p} is not valid JSON: {e}") from None

        cfg, model_cfg = read_json("tokenizer_config.json"), read_json("config.json")
        template = cfg.get("chat_template")
        if (folder / "chat_template.jinja").is_file():  # newer checkpoints keep it in its own file
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # several named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def special_id(name: str) -> int | None:
            tok = cfg.get(f"{name}_token")
            tok = tok.get("content") if isinstance(tok, dict) else tok
            if isinstance(tok, str) and backend.token_to_id(tok) is not None:
                return backend.token_to_id(tok)
            fallback = model_cfg.get(f"{name}_token_id")
            return fallback[0] if isinstance(fallback, list) and fallback else fallback

        specials = [i for i, t in backend.get_added_tokens_decoder().items() if t.special]
        return cls(
            backend,
            bos_id=special_id("bos"),
            eos_id=special_id("eos"),
            pad_id=special_id("pad"),
            special_ids=specials,
            chat_template=template,
            source=str(folder),
        )

    # ---- properties ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def pad_id(self) -> int | None:
        return self._pad_id

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def eos_token(self) -> str | None:
        return None if self._eos_id is None else self.backend.id_to_token(self._eos_id)

    @property
    def bos_token(self) -> str | None:
        return None if self._bos_id is None else self.backend.id_to_token(self._bos_id)

    @functools.cached_property
    def missing_bytes(self) -> frozenset[int]:
        """Byte values with no single-byte token: text containing them loses those bytes when encoded.

        Byte-level vocabularies only; empty for others (e.g. SentencePiece ones loaded with from_hf)."""
        if not isinstance(self.backend.decoder, decoders.ByteLevel):
            return frozenset()
        return frozenset(b for b, ch in bytes_to_unicode().items() if self.backend.token_to_id(ch) is None)

    def id_to_token(self, i: int) -> str | None:
        """The vocabulary spelling of id ``i`` (byte alphabet: ``Ġ`` is a space, ``Ċ`` a newline)."""
        return self.backend.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"

    # ---- encode / decode ----------------------------------------------------------------------------

    def _check_text(self, text: Any) -> str:
        if not isinstance(text, str):
            raise InvalidRequestError(f"text to encode must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(
                "the text contains invalid UTF-8 (lone surrogates, e.g. bytes from a terminal that is not UTF-8); "
                "clean it first with jaxlab.io.tokenizer.sanitize(text)"
            ) from None
        return text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> ids [T]. Special-token strings in ``text`` (``<|im_start|>``) become their single id.

        ``add_special_tokens`` adds BOS/EOS only if the model file asks for them (SmolLM2 does not)."""
        return self.backend.encode(self._check_text(text), add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Several texts -> one id list each (encoded in parallel, in Rust)."""
        texts = [self._check_text(t) for t in texts]
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Ids [T] (list, numpy or jax array) -> text. Bytes that do not form valid UTF-8 become U+FFFD."""
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise InvalidRequestError(f"decode takes one sequence of ids (shape [T]), got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise InvalidRequestError(f"token ids must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = int(arr[(arr < 0) | (arr >= self.vocab_size)][0])
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self.backend.decode(arr.astype(np.int64).tolist(), skip_special_tokens=skip_special_tokens)

    # ---- batching -----------------------------------------------------------------------------------

    def pad_batch(
        self, seqs: Sequence[Sequence[int]], pad_id: int | None = None, side: str = "left"
    ) -> tuple[np.ndarray, np.ndarray]:
        """:func:`pad_batch` with this tokenizer's pad id (or its EOS id, if it has no pad token)."""
        if pad_id is None:
            pad_id = self.pad_id if self.pad_id is not None else self.eos_id
        if pad_id is None:
            raise InvalidRequestError(f"{self.source} defines no pad or EOS token; pass pad_id explicitly")
        return pad_batch(seqs, pad_id, side)

    # ---- chat ---------------------------------------------------------------------------------------

    @functools.cached_property
    def _template(self):
        if self._chat_template is None:
            raise InvalidRequestError(f"{self.source} has no chat template; pass a plain prompt instead of messages")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):  # templates call this to refuse a conversation
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            from datetime import datetime

            return datetime.now().strftime(fmt)

        # The same environment transformers uses, so templates render byte for byte the same: a sandbox
        # (templates come from model files), trim_blocks/lstrip_blocks, and {% break %}/{% continue %}.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        try:
            return env.from_string(self._chat_template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ModelFileError(f"{self.source}: the chat template is not valid Jinja ({e})") from None

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Render ``[{"role": ..., "content": ...}, ...]`` with the model's own chat template.

        ``add_generation_prompt`` appends the header of an assistant turn (``<|im_start|>assistant\\n``), so
        the model's next tokens are the reply. Returns the prompt text, or its ids [T] if ``tokenize``."""
        import jinja2

        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise InvalidRequestError("messages must be a list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise InvalidRequestError(f"message {i} must be a dict with str 'role' and 'content', got {m!r}")
        names = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": None if self.pad_id is None else self.id_to_token(self.pad_id),
        }
        try:
            text = self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None,  # passed as None (not left undefined), as transformers does
                documents=None,
                **{**names, **template_kwargs},
            )
        except jinja2.exceptions.TemplateError as e:
            raise InvalidRequestError(f"the chat template of {self.source} refused these messages: {e}") from None
        return self.encode(text) if tokenize else text


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left") -> tuple[np.ndarray, np.ndarray]:
    """Pad id lists to one length -> (ids [B, T] int32, mask [B, T] bool, True on real tokens).

    Left padding (the default) lines every prompt's *last* token up in the last column, so one decode
    step appends the next token of every row at the same position."""
    if side not in ("left", "right"):
        raise InvalidRequestError(f"side must be 'left' or 'right', got {side!r}")
    if len(seqs) == 0:
        raise InvalidRequestError("pad_batch needs at least one sequence")
    length = max(len(s) for s in seqs)
    ids = np.full((len(seqs), length), pad_id, dtype=np.int32)
    mask = np.zeros((len(seqs), length), dtype=bool)
    for row, s in enumerate(seqs):
        cols = slice(length - len(s), length) if side == "left" else slice(0, len(s))
        ids[row, cols] = np.asarray(s, dtype=np.int32).reshape(-1)
        mask[row, cols] = True
    return ids, mask


class StreamDecoder:
    """Turns ids into text one id at a time, never emitting half a character.

    Decoding a growing window and printing what is new would break in two ways: a token can end inside
    a multi-byte UTF-8 character (decoded alone, its bytes give U+FFFD), and some decoders change a
    token's text depending on what precedes it. So we decode two overlapping windows of ids -- one
    ending at what was already printed, one ending now -- print the difference, and wait while the
    newest text ends in U+FFFD (an incomplete character). The same scheme as text-generation servers
    (TGI, vLLM). Invariant: ``"".join(pushes) + flush() == tokenizer.decode(all ids)``."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # both windows start here: the print boundary before last, for context
        self._read = 0  # the text of ids[:_read] has been returned

    def _decode(self, lo: int, hi: int) -> str:
        return self.tokenizer.decode(self._ids[lo:hi], skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (often '', e.g. for the first half of an emoji)."""
        if not 0 <= int(token_id) < self.tokenizer.vocab_size:  # check before it enters the window
            last = self.tokenizer.vocab_size - 1
            raise InvalidRequestError(f"token id {token_id} is outside the vocabulary (0..{last})")
        self._ids.append(int(token_id))
        before = self._decode(self._prefix, self._read)
        now = self._decode(self._prefix, len(self._ids))
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return now[len(before) :]
        return ""

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character decodes to U+FFFD) and start over."""
        before = self._decode(self._prefix, self._read)
        now = self._decode(self._prefix, len(self._ids))
        self._ids, self._prefix, self._read = [], 0, 0
        return now[len(before) :]


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # surrogateescape's spelling of one undecodable byte
_SURROGATE = re.compile("[\ud800-\udfff]")  # any other lone surrogate (e.g. half of a broken emoji)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0, DEL, C1; not \t \n \r


def sanitize(text: str) -> tuple[str, list[str]]:
    """Make user text safe to encode -> (clean text, human-readable list of changes; empty if none).

    * Lone surrogates (U+D800..U+DFFF) become U+FFFD. Python uses them for bytes that are not valid
      UTF-8 (``sys.argv`` and ``os.environ`` decode with ``surrogateescape``: byte 0xFF -> '\\udcff'); they
      cannot be encoded to UTF-8 at all, so the tokenizer would refuse the text.
    * Control characters (C0, DEL and C1) are removed, except tab, newline and carriage return: they
      are invisible, mean nothing to the model, and several have no token in the vocabulary."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"sanitize takes a str, got {type(text).__name__}")
    text, n_bytes = _ESCAPED_BYTE.subn("\ufffd", text)
    text, n_surrogates = _SURROGATE.subn("\ufffd", text)
    text, n_controls = _CONTROL.subn("", text)
    report = []
    plural = lambda n, word: f"{n} {word}{'s' if n != 1 else ''}"  # noqa: E731
    if n_bytes:
        report.append(f"replaced {plural(n_bytes, 'invalid UTF-8 byte')} with U+FFFD")
    if n_surrogates:
        report.append(f"replaced {plural(n_surrogates, 'lone surrogate')} with U+FFFD")
    if n_controls:
        report.append(f"removed {plural(n_controls, 'control character')}")
    return text, report


def prompt_ids(
    tokenizer,
    text: str | None = None,
    *,
    messages: Sequence[Mapping] = (),
    system: str | None = None,
    raw: bool = False,
) -> list[int]:
    """The ids a model reads before its answer; the one prompt builder of the command line, the server, the
    bench and fine-tuning. Every text is :func:`sanitize`\\ d first.

    * ``raw``: ``text`` encoded as it is, no chat template (an empty text starts from BOS);
    * else the chat template over ``messages`` (earlier turns, ``{"role", "content"}``), ``system`` as the first
      message when there is no earlier turn, and ``text`` as the user's new turn, ready for the assistant."""
    if raw:
        return tokenizer.encode(sanitize(text or "")[0]) or [tokenizer.bos_id]
    turns = [dict(m, content=sanitize(m["content"])[0]) for m in messages]
    if system and not turns:
        turns.append({"role": "system", "content": sanitize(system)[0]})
    if text is not None:
        turns.append({"role": "user", "content": sanitize(text)[0]})
    return tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
