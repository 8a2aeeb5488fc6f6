"""``selfsup export RUN --format onnx|torchscript``: an evaluation source's backbone as one ONNX or TorchScript file
for runtimes without selfsup (docs/export.md, "ONNX and TorchScript").

The file takes ``images`` (batch, C, S, S), any batch size, and returns ``features`` (batch, D): the source's pooled
feature. ``normalize=True`` (the default, ``--normalize in``) puts the model's own normalisation in the graph: inputs
are RGB (or gray) floats in [0, 1]; ``normalize=False`` (``--normalize out``) takes inputs already normalised by the
``mean`` / ``std`` that the metadata states. The ONNX metadata (``metadata_props``: ``selfsup`` = JSON) records the
normalisation, mean, std, image size, opset and the source; a TorchScript file holds the same JSON as its extra file
``selfsup.json``. Each file is checked on export against eager PyTorch on the same random inputs at two batch sizes
(onnxruntime for ONNX): the largest absolute difference over the features' scale (their largest absolute value)
must be under ``TOLERANCE``.
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from selfsup.diskspace import atomic_write
from selfsup.errors import UserError
from selfsup.models.vit import VisionTransformer
from selfsup.runs.source import EvalSource, load_source

try:  # optional: pip install selfsup[onnx]
    import onnx
    import onnxruntime
except ImportError:  # pragma: no cover - the extra is installed with dev
    onnx = onnxruntime = None

PORTABLE_FORMATS = ("onnx", "torchscript")
OPSET = 18  # the lowest opset torch's exporter (torch.export based) implements
TOLERANCE = 1e-4  # largest |exported − eager| / largest |eager feature|
FORMAT_TAG = "selfsup-portable/1"


class Normalized(nn.Module):
    """The backbone with its input normalisation in front (``normalize``) or without it."""

    def __init__(self, backbone: nn.Module, mean, std, normalize: bool):
        super().__init__()
        self.backbone, self.normalize = backbone.eval(), normalize
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        x = (images - self.mean) / self.std if self.normalize else images
        return self.backbone(x)


@dataclass
class Exported:
    """The written file, its format, metadata and the check's largest relative difference."""

    path: Path
    format: str
    meta: dict
    max_rel_diff: float


def _image_size(source: EvalSource, image_size: int | None) -> int:
    size = int(image_size or source.meta["image_size"])
    backbone = source.backbone
    if isinstance(backbone, VisionTransformer) and size % backbone.patch_size:
        raise UserError(f"--image-size {size} is not a multiple of the ViT's patch size {backbone.patch_size}; "
                        f"pick e.g. {size // backbone.patch_size * backbone.patch_size or backbone.patch_size}")
    return size


def portable_meta(source: EvalSource, fmt: str, normalize: bool, size: int, opset: int | None) -> dict:
    """The JSON the exported file carries."""
    m = source.meta
    return {"format": FORMAT_TAG, "runtime_format": fmt, "source": str(source.weights), "backbone": m.get("backbone"),
            "kwargs": m.get("kwargs", {}), "image_size": size, "in_chans": int(m.get("in_chans", 3)),
            "normalization": "in" if normalize else "out",
            "input": "float32 RGB in [0, 1]" if normalize else "float32, normalised by mean and std",
            "mean": list(m["mean"]), "std": list(m["std"]),
            "num_features": getattr(source.backbone, "num_features", None), "opset": opset,
            "inputs": ["images"], "outputs": ["features"], "dynamic_axes": {"images": [0], "features": [0]}}


def _onnx_bytes(model: nn.Module, example: Tensor, opset: int, meta: dict) -> bytes:
    """The ONNX file of ``model`` (batch dimension dynamic) with ``meta`` in its metadata."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(model, (example,), input_names=["images"], output_names=["features"],
                                        dynamic_shapes=({0: batch},), opset_version=opset, dynamo=True,
                                        verbose=False, optimize=True)
        except Exception as e:
            raise UserError(f"the backbone does not export to ONNX ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:160]}); try --format torchscript") from None
    proto = program.model_proto
    onnx.helper.set_model_props(proto, {"selfsup": json.dumps(meta)})
    return proto.SerializeToString()


def max_rel_diff(run, eager: nn.Module, size: int, channels: int) -> float:
    """The largest |run(x) − eager(x)| over the largest |eager(x)|, on random inputs at batch sizes 1 and 3."""
    worst = 0.0
    gen = torch.Generator().manual_seed(0)
    for b in (1, 3):
        x = torch.rand(b, channels, size, size, generator=gen)
        with torch.no_grad():
            want = eager(x)
        got = run(x)
        if tuple(got.shape) != tuple(want.shape):
            raise UserError(f"the exported model returns {tuple(got.shape)} for a batch of {b}, eager "
                            f"{tuple(want.shape)}; report it")
        worst = max(worst, (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12))
    return worst


def onnx_runner(data: bytes):
    """``x → features`` of an ONNX file's bytes through onnxruntime on the CPU."""
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(["features"], {"images": x.numpy()})[0])


def export_portable(location, out, fmt: str = "onnx", *, normalize: bool = True, image_size: int | None = None,
                    opset: int = OPSET, check: bool = True) -> Exported:
    """Write the backbone of ``location`` (anything ``selfsup eval`` accepts) to ``out`` as ONNX or TorchScript,
    checked against eager PyTorch (``TOLERANCE``)."""
    if fmt not in PORTABLE_FORMATS:
        raise UserError(f"--format {fmt}: choose one of {', '.join(PORTABLE_FORMATS)}")
    if fmt == "onnx" and onnx is None:
        raise UserError("--format onnx needs onnx and onnxruntime: pip install 'selfsup[onnx]'")
    source = location if isinstance(location, EvalSource) else load_source(location)
    size = _image_size(source, image_size)
    channels = int(source.meta.get("in_chans", 3))
    model = Normalized(source.backbone.cpu().float(), source.meta["mean"], source.meta["std"], normalize).eval()
    meta = portable_meta(source, fmt, normalize, size, opset if fmt == "onnx" else None)
    example = torch.rand(2, channels, size, size, generator=torch.Generator().manual_seed(1))
    if fmt == "onnx":
        data = _onnx_bytes(model, example, opset, meta)
        run = onnx_runner(data)
    else:
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(model, example)
        except Exception as e:
            raise UserError(f"the backbone does not trace to TorchScript ({type(e).__name__}); "
                            "use --format onnx") from None
        buffer = io.BytesIO()
        with warnings.catch_warnings():  # torch.jit's deprecation notice: the file is what a TorchScript user loads
            warnings.simplefilter("ignore")
            torch.jit.save(traced, buffer, _extra_files={"selfsup.json": json.dumps(meta)})
        data = buffer.getvalue()

        def run(x):
            with torch.no_grad():
                return traced(x)
    worst = max_rel_diff(run, model, size, channels) if check else float("nan")
    if check and not worst < TOLERANCE:
        raise UserError(f"the {fmt} export differs from eager PyTorch by {worst:.2e} of the features' scale (over "
                        f"{TOLERANCE:g}); report it, or try the other --format")
    meta["check_max_rel_diff"] = worst
    out = Path(out)
    atomic_write(out, lambda f: f.write(data), f"the {fmt} model")
    return Exported(out, fmt, meta, worst)
