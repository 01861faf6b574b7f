"""Write the golden files of jaxlab's references: data/reference/smollm2_135m.json (Hugging Face transformers on
the embedded SmolLM2 GGUF) and data/reference/all_minilm_l6_v2.json (transformers' BertModel on the embedded
all-MiniLM-L6-v2, with sentence-transformers' pooling).

Run with `make reference` (or `.venv/bin/python scripts/make_reference.py`). Needs torch + transformers,
which `make` installs. Notebooks read the files so they can check parity without torch;
tests/tools/test_reference.py and tests/engine/test_encoder.py regenerate them in memory and fail when a stored
copy is stale.
"""

from jaxlab.io import assets
from jaxlab.tools import encoder_reference
from jaxlab.tools.reference import make_golden, write_golden

if __name__ == "__main__":
    print(f"wrote {write_golden(make_golden(assets.model_path()))}")
    print(f"wrote {encoder_reference.write_golden(encoder_reference.make_golden())}")
