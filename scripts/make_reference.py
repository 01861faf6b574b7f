"""Write data/reference/smollm2_135m.json: golden outputs of Hugging Face transformers (the reference).

Run with `make reference` (or `.venv/bin/python scripts/make_reference.py`). Needs torch + transformers,
which `make` installs. Notebooks read the file so they can check parity without torch;
tests/tools/test_reference.py regenerates it in memory and fails when the stored copy is stale.
"""

from jaxlab.io import assets
from jaxlab.tools.reference import make_golden, write_golden

if __name__ == "__main__":
    path = write_golden(make_golden(assets.model_path()))
    print(f"wrote {path}")
