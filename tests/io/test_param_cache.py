"""The converted-parameter cache's file names: a changed source never maps to an old file, and a cache folder
copied whole (a classroom's wheelhouse, times kept) still finds its converted files."""

from __future__ import annotations

import os
import shutil

from jaxlab.io import param_cache


def test_a_cache_folder_copied_whole_keeps_its_names(tmp_path):
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    model = cache / "models" / "m.gguf"
    model.write_bytes(b"weights")
    name = param_cache.params_file(cache, model).name
    copy = tmp_path / "elsewhere" / "cache"
    shutil.copytree(cache, copy)  # copy2: times kept, as `cp -Rp` does
    assert param_cache.params_file(copy, copy / "models" / "m.gguf").name == name


def test_a_changed_or_moved_source_gets_a_new_name(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    model = tmp_path / "m.gguf"  # outside the cache: named by its absolute path
    model.write_bytes(b"weights")
    name = param_cache.params_file(cache, model).name
    other = tmp_path / "b" / "m.gguf"
    other.parent.mkdir()
    shutil.copy2(model, other)
    assert param_cache.params_file(cache, other).name != name
    st = model.stat()
    model.write_bytes(b"WEIGHTS")  # same size, rewritten in place
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert param_cache.params_file(cache, model).name != name
    assert param_cache.params_file(cache, model, extra="quant-int8").name != param_cache.params_file(cache, model).name
