"""A tiny but real model folder, built by the tests themselves (no download, no torch).

``build_model_folder`` writes the three files of a model folder:

- ``model.onnx``: an ONNX graph made with ``onnx.helper`` — a token-embedding
  table (``Gather`` on ``input_ids``) whose rows are multiplied by the attention
  mask, giving ``last_hidden_state`` of shape (batch, tokens, width), the output
  a BERT-style export has. Mean pooling over it is a bag of words, so texts
  sharing words get close vectors. ``seed`` changes the table: a different model.
- ``tokenizer.json``: a ``tokenizers`` WordLevel model (lower-cased, split on
  whitespace and punctuation, ``[CLS] … [SEP]`` around each text).
- ``cpersona-model.json``: the pooling/normalisation/window config.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = (
    "the automobile needs new tyres car wants fresh tires bicycle bike pedals cranks "
    "weather sunny rain cloudy today tomorrow coffee tea morning evening cat dog "
    "music piano guitar lesson book library reading garden tomato"
).split()
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")


def vocabulary() -> dict[str, int]:
    return {token: i for i, token in enumerate((*SPECIALS, *WORDS))}


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = vocabulary()
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tokenizer.save(str(path))


def write_onnx(path: Path, *, dimension: int, seed: int, vocab_size: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(seed).standard_normal((vocab_size, dimension)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["tokens", "mask_3d"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-embedder",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        outputs=[helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", dimension])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime release of the last years
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_model_folder(
    folder: Path, *, dimension: int = 16, seed: int = 7, name: str = "tiny-test", max_tokens: int = 12, **config: object
) -> Path:
    """A complete model folder at ``folder`` (created); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder / "tokenizer.json")
    write_onnx(folder / "model.onnx", dimension=dimension, seed=seed, vocab_size=len(vocabulary()))
    settings = {
        "name": name,
        "model_file": "model.onnx",
        "pooling": "mean",
        "normalize": True,
        "max_tokens": max_tokens,
        "query_prefix": "",
        "passage_prefix": "",
        "dimension": dimension,
    }
    settings.update(config)
    (folder / "cpersona-model.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder
