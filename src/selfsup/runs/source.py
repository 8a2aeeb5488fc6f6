"""What to evaluate: a run folder, an exported backbone (.safetensors) or a Lightning .ckpt → backbone + metadata;
and a flow run folder → its EMA model for sampling (``load_flow_run``).

A run folder gives its ``backbone.safetensors``, else ``checkpoints/last.ckpt`` rebuilt with its
``config.yaml``. Results go to ``RUN/eval/`` (an exported file outside a run: ``<file>-eval/``), keyed by the
weights they evaluated (``weights_identity``): the run's trained backbone ``knn.json``, its random init
``knn.init.json``, a checkpoint ``knn.step<N>.json``, so no evaluation overwrites the result of other weights.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from selfsup.checkpoints import load_checkpoint
from selfsup.config import AugmentSection, DataConfig, read_run_config, resolve
from selfsup.data.datasets import load_dataset
from selfsup.errors import UserError
from selfsup.export import HEADS_FILE, load_exported, load_heads, read_meta, rebuild_backbone
from selfsup.methods import METHODS, DataInfo
from selfsup.methods.build import backbone_meta, build_method, data_info
from selfsup.models.sit import FLOW_ENCODER
from selfsup.models.vit import LastBlocks, VisionTransformer
from selfsup.models.backbones import TIMM_PREFIX
from selfsup.models.vit import VIT_SIZES
from selfsup.runs.facts import start_label
from selfsup.weights import IMAGENET_NORM, build_from_weights, file_vit_kwargs

WHAT = ("pass a selfsup run folder, an exported backbone .safetensors, a run's checkpoints/*.ckpt, a DINOv2 "
        "torch.hub or training checkpoint (.pth), timm:<name>, or any model.weights file with --backbone naming its "
        "architecture")
FOREIGN_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".tar")  # .tar: a .pth.tar (MoCo v3's, I-JEPA's)
FOREIGN_IMAGE_SIZE = 224  # a foreign checkpoint is evaluated at this size (its position table resampled to it)


@dataclass(frozen=True)
class RunSections:
    """What evaluation reads of a run's config: its data and augment sections."""

    data: DataConfig
    augment: AugmentSection


@dataclass
class EvalSource:
    """A loaded backbone, how to rebuild it (``meta``), where its weights and its run live."""

    backbone: nn.Module
    meta: dict
    weights: Path
    run_dir: Path | None
    out_dir: Path
    run_cfg: RunSections | None = None  # the run's data and augment sections, when there is a run
    embedding: str = "backbone"  # backbone | projector | predictor (the backbone followed by the method's heads)
    weights_tag: str = ""  # the results' file-name key of these weights ("" the run's trained backbone)
    weights_label: str = "trained"  # what was evaluated, as the results and the report name it

    @property
    def fingerprint(self) -> str:
        """Identity of the weights for the feature cache: resolved path, size, modification time, embedding; a
        ``model.weights`` source's (``_from_foreign``): the loaded tensors' sha256 and the architecture built."""
        facts = self.meta.get("weights")
        if isinstance(facts, dict) and facts.get("sha256"):
            raw = f"{facts['sha256']}|{self.meta['backbone']}|{self.embedding}"
            return hashlib.sha1(raw.encode()).hexdigest()[:16]
        st = self.weights.stat()
        raw = f"{self.weights.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.embedding}"
        return hashlib.sha1(raw.encode()).hexdigest()[:16]


INIT_FILE = "backbone_init.safetensors"  # the engine's export of the evaluated backbone at init


def weights_identity(path: Path, run_dir: Path | None, step: int | None = None) -> tuple[str, str]:
    """(tag, label) of the weights in ``path``: results are written as ``<protocol>[.<tag>].json``.

    The run's ``backbone.safetensors``: ("", "trained"); its ``backbone_init.safetensors``: ("init", "random
    init"), or ("init", "start (weights: SOURCE)") for a run started from ``model.weights``; a checkpoint:
    ("step<N>", "checkpoint at step N"); another file in a run folder: (its stem, its name); an exported file
    outside a run: ("", its name), its results have their own ``<file>-eval/`` folder.
    """
    if path.suffix == ".ckpt":
        return (f"step{step}", f"checkpoint at step {step}") if step is not None else (path.stem, path.name)
    if run_dir is None:
        return "", path.name
    if path.name == "backbone.safetensors":
        return "", "trained"
    if path.name == INIT_FILE:
        return "init", start_label(run_dir)
    return re.sub(r"[^\w-]+", "_", path.stem), path.name


def _run_cfg(run_dir: Path | None) -> RunSections | None:
    """The run's data and augment sections, read from its config.yaml without resolving the whole config."""
    if run_dir is None or not (run_dir / "config.yaml").exists():
        return None
    raw = read_run_config(run_dir)

    def section(cls, key):
        values = raw.get(key) or {}
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})

    return RunSections(section(DataConfig, "data"), section(AugmentSection, "augment"))


def _from_exported(path: Path, run_dir: Path | None) -> EvalSource:
    backbone, meta = load_exported(path)
    out = run_dir / "eval" if run_dir else path.with_name(f"{path.stem}-eval")
    tag, label = weights_identity(path, run_dir)
    return EvalSource(backbone, meta, path, run_dir, out, _run_cfg(run_dir), weights_tag=tag, weights_label=label)


def _from_checkpoint(path: Path) -> EvalSource:
    """The backbone weights (``backbone.*``) of a pretraining checkpoint, rebuilt from the run's config."""
    run_dir = next((d for d in (path.parent.parent, path.parent) if (d / "config.yaml").exists()), None)
    if run_dir is None:
        raise UserError(f"{path} is not inside a selfsup run folder (no config.yaml next to checkpoints/); {WHAT}")
    cfg = _run_cfg(run_dir)
    init = run_dir / INIT_FILE
    if init.exists():
        meta = read_meta(init)
    else:
        full = resolve(read_run_config(run_dir))
        meta = backbone_meta(full, data_info(full, load_dataset(full.data, "train")))
    ckpt = load_checkpoint(path, WHAT)  # weights-only: a file holding code is refused before any of it runs
    if meta.get("method") not in METHODS:
        raise UserError(f"{path} was made by method {meta.get('method')!r}, which this selfsup does not know; {WHAT}")
    state = METHODS[meta["method"]].backbone_state(ckpt["state_dict"])  # backbone.*, or a flow run's EMA model
    if not state:
        raise UserError(f"{path} holds no backbone weights; {WHAT}")
    backbone = rebuild_backbone(meta)
    try:
        backbone.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not fit the run's {meta['backbone']} ({str(e).splitlines()[0]})") from None
    step = ckpt.get("global_step")
    tag, label = weights_identity(path, run_dir, step if isinstance(step, int) else None)
    return EvalSource(backbone, meta, path, run_dir, run_dir / "eval", cfg, weights_tag=tag, weights_label=label)


def _is_selfsup_export(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as f:
            return "selfsup" in (f.metadata() or {})
    except Exception:  # unreadable: the export reader says so in its own line
        return True


@dataclass(frozen=True)
class NamedWeights:
    """A ``model.weights`` source evaluated as the architecture ``backbone`` (a selfsup backbone or ``timm:<name>``;
    a selfsup ViT's settings read from the file's shapes, its head count the name's): ``selfsup eval --backbone``,
    for a file that cannot say its own (a torchvision or timm state dict, a method's release checkpoint)."""

    spec: str
    backbone: str


def _from_foreign(spec: str, backbone: str = "auto") -> EvalSource:
    """Any ``model.weights`` source (``weights.build_from_weights``): one that says its own architecture (a DINOv2
    hub or training checkpoint, ``timm:<name>``) with ``backbone`` auto, any other with its backbone named; built
    for RGB images at ``FOREIGN_IMAGE_SIZE`` px in its source's normalisation (ImageNet's where it states none); its
    results go to ``<file>-eval/`` (``timm-<name>-eval/`` here for a timm name); the dataset is the command's
    ``--data`` / ``--root`` (default imagefolder)."""
    kwargs = file_vit_kwargs(spec, "the checkpoint") if backbone in VIT_SIZES else {}
    network, facts, norm = build_from_weights(spec, backbone, kwargs, 3, FOREIGN_IMAGE_SIZE, "the checkpoint")
    mean, std = norm or IMAGENET_NORM
    if backbone == "auto":
        name, kwargs = type(network).__name__, dict(getattr(network, "kwargs", {}))
    else:  # built again by name (eval finetune)
        name, kwargs = backbone, {**kwargs, "in_chans": 3, "image_size": FOREIGN_IMAGE_SIZE}
    meta = {"backbone": name, "kwargs": kwargs, "image_size": FOREIGN_IMAGE_SIZE, "in_chans": 3,
            "mean": list(mean), "std": list(std), "dataset": "imagefolder", "method": None, "weights": facts.as_dict()}
    if spec.startswith(TIMM_PREFIX):
        path = Path(spec.replace(":", "-"))
        return EvalSource(network, meta, path, None, Path(f"{path}-eval"), weights_label=spec)
    path = Path(spec)
    return EvalSource(network, meta, path, None, path.with_name(f"{path.stem}-eval"), weights_label=path.name)


def load_source(location: str | Path | NamedWeights) -> EvalSource:
    """Resolve CKPT_OR_RUN (run folder, exported .safetensors, or .ckpt; a DINOv2 or ``timm:<name>`` source; any
    ``model.weights`` source with its architecture named, :class:`NamedWeights`) to an :class:`EvalSource`."""
    if isinstance(location, NamedWeights):
        if not location.spec.startswith(TIMM_PREFIX) and not Path(location.spec).is_file():
            raise UserError(f"{location.spec} is not a file: --backbone names the architecture of a weights file "
                            f"or timm:<name>; a run folder says its own (leave --backbone out)")
        return _from_foreign(location.spec, location.backbone)
    if str(location).startswith(TIMM_PREFIX):
        return _from_foreign(str(location))
    path = Path(location)
    if not path.exists():
        raise UserError(f"{path} does not exist; {WHAT}")
    if path.is_dir():
        if (path / "backbone.safetensors").exists():
            return _from_exported(path / "backbone.safetensors", path)
        if (path / "config.json").exists() and not (path / "config.yaml").exists():  # a transformers folder
            return _from_foreign(str(path))
        if (path / "checkpoints" / "last.ckpt").exists():
            return _from_checkpoint(path / "checkpoints" / "last.ckpt")
        if (path / "config.yaml").exists():  # a run killed or failed before its first checkpoint
            init = f"; evaluate its random init {path / INIT_FILE}" if (path / INIT_FILE).exists() else ""
            raise UserError(f"{path} is a selfsup run that stopped before its first checkpoint (no "
                            f"checkpoints/last.ckpt, no backbone.safetensors): nothing trained to evaluate; "
                            f"train it again{init}")
        raise UserError(f"{path} is not a selfsup run folder "
                        f"(no backbone.safetensors or checkpoints/last.ckpt); {WHAT}")
    if path.suffix == ".safetensors" and _is_selfsup_export(path):
        run_dir = path.parent if (path.parent / "config.yaml").exists() else None
        return _from_exported(path, run_dir)
    if path.suffix in FOREIGN_SUFFIXES:
        return _from_foreign(str(path))
    if path.suffix == ".ckpt":
        return _from_checkpoint(path)
    raise UserError(f"{path} is not a selfsup run or exported backbone; {WHAT}")


HEADS = {"projector": ("projector",), "predictor": ("projector", "predictor")}


def loss_embedding(source: EvalSource) -> str:
    """``--embedding loss``: the name (``projector`` / ``predictor``) of the embedding the run's loss normalises (the
    method's ``loss_embedding``); ``backbone`` where there is none or no checkpoint holds the heads."""
    ckpt = source.run_dir / "checkpoints" / "last.ckpt" if source.run_dir else None
    method = METHODS.get(source.meta.get("method"))
    heads = method.loss_embedding if method is not None else ()
    exported = _exported_heads(source)
    saved = (exported is not None and all(name in exported[1] for name in heads)) or (
        ckpt is not None and ckpt.exists() and _heads_fit(source, ckpt))
    if not heads or not saved:
        return "backbone"
    return next((name for name, chain in HEADS.items() if chain == heads), "backbone")


def with_heads(source: EvalSource, embedding: str) -> EvalSource:
    """The backbone followed by the method's heads (``projector``; ``predictor``: projector then predictor), in
    eval mode.

    The heads come from ``RUN/heads.safetensors`` (exported with ``backbone.safetensors`` at the end of training:
    nothing is rebuilt but the heads) when the evaluated weights are that backbone and the file holds every head of
    the chain. Otherwise (a run folder made before the file existed, a checkpoint, a head ``export.head_spec``
    cannot describe, e.g. a tracked linear predictor) the training module is rebuilt from the run's config and
    loaded from ``checkpoints/last.ckpt``, backbone and heads.

    The embedding-norm paper scores the embedding the loss sees; a ViT's backbone feature ends in
    LayerNorm, so its norm is nearly constant, while the heads' output norm is not.
    """
    exported = _exported_heads(source)
    if exported is not None and all(name in exported[1] for name in HEADS[embedding]):
        path, heads = exported
        chain = nn.Sequential(source.backbone, *(heads[name] for name in HEADS[embedding])).eval()
        return EvalSource(chain, source.meta, path, source.run_dir, source.out_dir, source.run_cfg,
                          embedding=embedding, weights_tag=source.weights_tag, weights_label=source.weights_label)
    ckpt = source.run_dir / "checkpoints" / "last.ckpt" if source.run_dir else None
    if ckpt is None or not ckpt.exists():
        raise UserError(f"--embedding {embedding} needs the run's checkpoints/last.ckpt (it holds the heads); "
                        "pass the run folder")
    if not _heads_fit(source, ckpt):
        raise UserError(f"--embedding {embedding} evaluates the backbone and heads of the run's checkpoints/last.ckpt, "
                        f"not {source.weights.name} (no heads are saved with it); use --embedding backbone")
    m = source.meta
    model = build_method(resolve(read_run_config(source.run_dir)),
                         DataInfo(m["in_chans"], m["image_size"], tuple(m["mean"]), tuple(m["std"])),
                         load_weights=False)  # the checkpoint's weights are loaded next
    missing = [name for name in HEADS[embedding] if not isinstance(getattr(model, name, None), nn.Module)]
    if missing:
        raise UserError(f"--embedding {embedding}: a {m.get('method')} run has no {missing[0]}; "
                        "use --embedding backbone")
    saved = load_checkpoint(ckpt, WHAT)
    try:
        model.load_state_dict(saved["state_dict"])
    except Exception as e:
        raise UserError(f"{ckpt} does not fit the run's model ({type(e).__name__}); {WHAT}") from None
    chain = nn.Sequential(model.backbone, *(getattr(model, name) for name in HEADS[embedding])).eval()
    step = saved.get("global_step") if source.weights.suffix != ".ckpt" else None
    tag, label = source.weights_tag, source.weights_label
    final = _final_step(source.run_dir)
    if step is not None and final is not None and step != final:  # the checkpoint is not the exported backbone's
        tag, label = weights_identity(ckpt, source.run_dir, step)
    return EvalSource(chain, m, ckpt, source.run_dir, source.out_dir, source.run_cfg, embedding=embedding,
                      weights_tag=tag, weights_label=label)


def _exported_heads(source: EvalSource) -> tuple[Path, dict[str, nn.Module]] | None:
    """(``RUN/heads.safetensors``, its heads) when the evaluated weights are the run's exported backbone (the heads
    were written with it); None otherwise or where the run has no such file."""
    if source.run_dir is None or source.weights.resolve() != (source.run_dir / "backbone.safetensors").resolve():
        return None
    path = source.run_dir / HEADS_FILE
    return (path, load_heads(path)) if path.exists() else None


def _heads_fit(source: EvalSource, ckpt: Path) -> bool:
    """The run's heads (in ``last.ckpt``) belong to the evaluated weights: the trained backbone or that checkpoint."""
    return source.weights.resolve() in (ckpt.resolve(), (source.run_dir / "backbone.safetensors").resolve())


def _final_step(run_dir: Path) -> int | None:
    """The step the run ended at (``run.json``), None when it has not finished."""
    try:
        return int(json.loads((run_dir / "run.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def with_projector(source: EvalSource) -> EvalSource:
    """The backbone followed by the method's projector (``with_heads(source, "projector")``)."""
    return with_heads(source, "projector")


def with_flow_features(source: EvalSource, t: float | None, block: int | None) -> EvalSource:
    """A flow run's features at another noise level ``t`` and/or block (``--flow-t``, ``--flow-block``)."""
    if source.meta.get("backbone") != FLOW_ENCODER:
        raise UserError("--flow-t/--flow-block apply to flow runs; "
                        f"{source.weights} holds a {source.meta.get('backbone')}")
    encoder = source.backbone
    t = encoder.t if t is None else t
    block = encoder.block if block is None else block
    if not 0 <= t <= 1:
        raise UserError(f"--flow-t={t} must be in [0, 1] (0 = clean image, 1 = pure noise)")
    if not 1 <= block <= encoder.model.depth:
        raise UserError(f"--flow-block={block} is outside the model's blocks 1..{encoder.model.depth}")
    encoder.t, encoder.block = t, block
    meta = {**source.meta, "kwargs": {**source.meta["kwargs"], "t": t, "block": block}}
    return replace(source, backbone=encoder, meta=meta, embedding=f"flow-t{t:g}-block{block}")


def with_last_blocks(source: EvalSource, n: int) -> EvalSource:
    """A ViT's feature as the concatenation of its last ``n`` blocks, each normalised and pooled (``--last-blocks``:
    ``models.vit.LastBlocks``); the results and the feature cache are keyed ``last<n>blocks``."""
    backbone = source.backbone
    if source.embedding != "backbone":
        raise UserError(f"--last-blocks concatenates the backbone's blocks; --embedding {source.embedding} "
                        "scores another output: give one of the two")
    if not isinstance(backbone, VisionTransformer):
        raise UserError(f"--last-blocks applies to ViT backbones; {source.weights} holds a "
                        f"{source.meta.get('backbone', type(backbone).__name__)}: leave --last-blocks out")
    if not 1 <= n <= backbone.depth:
        raise UserError(f"--last-blocks={n} is outside the ViT's blocks 1..{backbone.depth}")
    if n == 1:
        return source
    return replace(source, backbone=LastBlocks(backbone, n).eval(), embedding=f"last{n}blocks")


# --------------------------------------------------------------------------- flow runs, for sampling


def _flow_run_config(run_dir: Path):
    """The resolved RunConfig of a flow run folder; any other run is refused."""
    raw = read_run_config(run_dir)
    name = (raw.get("method") or {}).get("name")
    if name not in METHODS or METHODS[name].family != "flow":
        flow = ", ".join(n for n, cls in METHODS.items() if cls.family == "flow")
        raise UserError(f"{run_dir} is a {name} run, not a flow run; pass a run of {flow} "
                        "(selfsup pretrain self-flow-fmnist, ...)")
    return resolve(raw)


def load_flow_run(run_dir) -> tuple[nn.Module, object, dict]:
    """(EMA SiT in eval mode on CPU, the run's RunConfig, info) of a flow run folder.

    Weights: ``backbone.safetensors`` (exported at the end of training), else the ``ema.*`` weights of
    ``checkpoints/last.ckpt``. ``info``: method, dataset, channels, image_size (the model's input size),
    data_size (the dataset's own), fit, num_classes (0: unconditional; the null class is num_classes),
    latents (True for a latent dataset), mean/std (pixel data: x = (image − mean)/std in [−1, 1]), weights.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run folder; pass the folder a flow pretrain run made")
    cfg = _flow_run_config(run_dir)
    exported, ckpt = run_dir / "backbone.safetensors", run_dir / "checkpoints" / "last.ckpt"
    meta_file = exported if exported.exists() else run_dir / "backbone_init.safetensors"
    if not meta_file.exists():
        raise UserError(f"{run_dir} holds no backbone.safetensors or backbone_init.safetensors; it is not a finished "
                        "or started flow run")
    meta = read_meta(meta_file)
    encoder = rebuild_backbone(meta)
    if exported.exists():
        state, source = load_file(str(exported)), exported
    elif ckpt.exists():
        full = load_checkpoint(ckpt, "pass a flow run folder made by selfsup pretrain")["state_dict"]
        state, source = METHODS[meta["method"]].backbone_state(full), ckpt
    else:
        raise UserError(f"{run_dir} has neither backbone.safetensors nor checkpoints/last.ckpt; train it first")
    try:
        encoder.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{source}: weights do not fit the run's model ({str(e).splitlines()[0]})") from None
    model = encoder.model.eval().requires_grad_(False)
    info = {"method": meta["method"], "dataset": meta["dataset"], "channels": meta["in_chans"],
            "image_size": model.input_size, "data_size": meta["image_size"], "fit": meta["kwargs"]["fit"],
            "num_classes": model.num_classes, "latents": cfg.data.name == "latents",
            "mean": meta["mean"], "std": meta["std"], "weights": str(source)}
    return model, cfg, info
