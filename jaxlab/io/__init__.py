"""Files in: ``assets`` (find, checksum and cache the embedded model; jaxlab's data files), ``gguf`` and
``hf`` (GGUF and Hugging Face checkpoints → a flat parameter tree), ``param_cache`` (the converted-parameter
cache), ``tokenizer`` (byte-level BPE from the GGUF metadata, chat template, streaming decode). Files out:
``export`` (float parameters + tokenizer → a Hugging Face folder or a GGUF file, with ``hf.write_hf`` and
``gguf.write_gguf``)."""
