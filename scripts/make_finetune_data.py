"""Write data/finetune/{train,validation,test}.jsonl from jaxlab.train.task (deterministic; a test compares)."""

import json

from jaxlab.io.assets import data_dir
from jaxlab.train import task


def main() -> None:
    folder = data_dir() / "finetune"
    folder.mkdir(parents=True, exist_ok=True)
    for split, examples in task.generate().items():
        lines = [json.dumps(e.to_json()) for e in examples]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{folder / split}.jsonl: {len(lines)} examples")


if __name__ == "__main__":
    main()
