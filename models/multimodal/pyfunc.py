"""The registered multimodal model as an MLflow pyfunc "from code", for loading the standard way.

A registered ``multimodal`` version is the training run's ``model`` folder (module and expert
states, ``model_config.json``, ``tokenizer.json``, ``digests.json``,
:mod:`models.multimodal.stored`); the register step adds ``MLmodel``, the code file
:mod:`models.multimodal.mlflow_model`, the signature and an input example there
(:func:`save_pyfunc`) before it records the folder's digests.
``mlflow.pyfunc.load_model("models:/multimodal/N")`` runs the code file from the downloaded
folder and :class:`MultimodalPyfunc` loads the states beside it with
:func:`~models.multimodal.stored.load_stored_model` (``weights_only=True``, its
``digests.json`` checked): nothing is unpickled. The MoE layers need a process group: the
first load joins a one-process group (gloo on CPU), as the project's scoring worker does. It
needs this repository's ``models.multimodal`` (and DeepSpeed) importable where it is loaded; the
pipeline and the server do not load it this way.

Input: a frame with ``image`` (a base64 PNG or JPEG, ``image_size`` square, RGB; 64 x 64 for
every config so far) and ``caption`` (text). Output: the L2-normalized ``image_embedding`` and
``text_embedding`` of each row and their cosine ``similarity`` (what retrieval ranks by).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from mlflow.pyfunc.model import PythonModel, PythonModelContext

from domains.captions.tokenizer import CaptionTokenizer
from models.multimodal.model import ImageTextTransformer
from models.multimodal.pairs import draw
from models.multimodal.stored import caption_tokens, load_stored_model

CODE_FILE = Path(__file__).with_name("mlflow_model.py")
IMAGE_COLUMN, CAPTION_COLUMN = "image", "caption"
EXAMPLE_ROWS = 2


def decode_image(value: str | bytes, size: int) -> np.ndarray:
    """``[size, size, 3]`` uint8 pixels of a base64 (or raw) PNG/JPEG; ValueError otherwise."""
    from PIL import Image

    try:
        content = value if isinstance(value, bytes) else base64.b64decode(str(value))
        image = Image.open(io.BytesIO(content))
        image.load()
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for foreign bytes
        raise ValueError(f"not a base64 PNG or JPEG image ({type(exc).__name__})") from None
    if image.size != (size, size):
        width, height = image.size
        raise ValueError(f"image of {width}x{height} px; the model takes {size}x{size}")
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


class MultimodalPyfunc(PythonModel):
    """The stored model in ``folder`` (the registered version's files): images and captions
    in, embeddings out."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.model: ImageTextTransformer | None = None
        self.tokenizer: CaptionTokenizer | None = None

    def load_context(self, context: PythonModelContext) -> None:
        from cascade.training.launch import init_distributed

        init_distributed()
        self.model, self.tokenizer = load_stored_model(self.folder)

    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("MultimodalPyfunc.predict before load_context; load it via mlflow")
        missing = [c for c in (IMAGE_COLUMN, CAPTION_COLUMN) if c not in model_input.columns]
        if missing:
            raise ValueError(f"multimodal input lacks columns {missing}")
        config = self.model.config
        pixels = []
        for row, value in enumerate(model_input[IMAGE_COLUMN]):
            try:
                pixels.append(decode_image(value, config.image_size))
            except ValueError as exc:
                raise ValueError(f"row {row}: {exc}") from None
        images = torch.from_numpy(np.stack(pixels)) if pixels else torch.zeros(0)
        captions = [str(c) for c in model_input[CAPTION_COLUMN]]
        tokens = caption_tokens(self.tokenizer, captions, config.max_tokens)
        with torch.no_grad():
            out = self.model(images, tokens)
        image, text = out.image_embedding, out.text_embedding
        return pd.DataFrame(
            {
                "image_embedding": list(image.numpy().astype(np.float64)),
                "text_embedding": list(text.numpy().astype(np.float64)),
                "similarity": (image * text).sum(dim=1).numpy().astype(np.float64),
            }
        )


def example_frame(rows: int = EXAMPLE_ROWS) -> pd.DataFrame:
    """Generated pictures (:func:`~models.multimodal.pairs.draw`, fixed seed) as base64 PNGs
    with their captions: the logged input example."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images, captions = [], []
    for _ in range(rows):
        pixels, caption = draw(rng)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        images.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
        captions.append(caption)
    return pd.DataFrame({IMAGE_COLUMN: images, CAPTION_COLUMN: captions})


def save_pyfunc(path: Path) -> None:
    """Write the pyfunc's files (``MLmodel``, the code file, signature, input example,
    environment) into the new folder ``path``; they go beside the stored model's files."""
    import mlflow.pyfunc
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    signature = ModelSignature(
        inputs=Schema([ColSpec("string", IMAGE_COLUMN), ColSpec("string", CAPTION_COLUMN)]),
        outputs=Schema(
            [
                ColSpec(Array(DataType.double), "image_embedding"),
                ColSpec(Array(DataType.double), "text_embedding"),
                ColSpec("double", "similarity"),
            ]
        ),
    )
    mlflow.pyfunc.save_model(
        str(path),
        python_model=str(CODE_FILE),
        signature=signature,
        input_example=example_frame(),
        pip_requirements=[
            f"torch=={torch.__version__.split('+')[0]}",
            "deepspeed",
            "pandas",
            "numpy",
            "pillow",
        ],  # fmt: skip
    )
