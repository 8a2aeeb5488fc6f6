"""selfsup from Python, the same code as the command line: ``pretrain`` a preset into a ``Run``, ``evaluate`` it;
or ``method``: a method as a LightningModule around your own backbone, for your own DataLoader and Trainer.

    import selfsup
    run = selfsup.pretrain("simclr-digits", trainer={"max_epochs": 1})   # = selfsup pretrain simclr-digits ...
    run.backbone, run.config.method, run.metrics[-1]                      # the trained network, its config, logs
    selfsup.evaluate(run, "knn")["results"]["k=20"]["top1"]               # = selfsup eval knn RUN

Overrides are the CLI's ``dotted.key=value`` items, given as sections (``trainer={"max_epochs": 1}``), as a mapping
of dotted keys (``{"trainer.max_epochs": 1}``) or as the strings themselves; the typed config checks them as the
CLI does (an unknown key or a bad value raises ``selfsup.errors.UserError``, one line naming the fix).
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from selfsup.config import RunConfig, load_run, load_run_config, merge, parse_overrides, preset_names, resolve
from selfsup.errors import UserError
from selfsup.methods import METHODS
from selfsup.eval import FinetuneConfig, KnnConfig, OodConfig, ProbeConfig, SegmentConfig, SpectrumConfig
from selfsup.eval.features import FEATURE_BATCH
from selfsup.runs import run_finetune, run_knn, run_linear, run_norms_ood, run_rankme, run_segment
from selfsup.runs.recipe import folder_recipe, gpu_preset_on_cpu, is_method_name, keep_grid
from selfsup.runs.resume import resume as resumed
from selfsup.runs.session import EvalSession
from selfsup.runs.source import NamedWeights, load_source

if TYPE_CHECKING:
    from lightning.pytorch import Callback


@dataclass(frozen=True)
class Run:
    """A run folder: its ``config``, its evaluated ``backbone`` (loaded on first use), its logged ``metrics`` (the
    rows of metrics.csv) and its ``facts`` (run.json: steps, epochs, status)."""

    path: Path

    @property
    def config(self) -> RunConfig:
        return load_run(self.path)

    @property
    def backbone(self) -> nn.Module:
        """The exported backbone (DINO's teacher, a flow run's encoder: what the run is judged by), eval mode."""
        return load_source(self.path).backbone.eval()

    @property
    def metrics(self) -> list[dict[str, float]]:
        path = self.path / "metrics.csv"
        if not path.exists():
            return []
        with open(path) as f:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]

    @property
    def facts(self) -> dict[str, Any]:
        path = self.path / "run.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def __fspath__(self) -> str:
        return str(self.path)


def override_items(overrides: dict[str, Any] | list[str] | None = None, **sections: dict[str, Any]) -> list[str]:
    """The CLI's ``key=value`` items of ``overrides`` (a mapping of dotted keys, or the items themselves) and of
    ``sections`` (``trainer={"max_epochs": 1}`` → ``trainer.max_epochs=1``). Values are written as YAML reads them."""
    items: list[str] = []
    if isinstance(overrides, (list, tuple)):
        items += [str(o) for o in overrides]
    elif overrides:
        items += [f"{k}={_yaml(v)}" for k, v in overrides.items()]
    for section, values in sections.items():
        if not isinstance(values, dict):
            raise UserError(f"selfsup.pretrain({section}=...) takes a mapping of that section's keys, e.g. "
                            f"{section}={{'key': value}}; got {type(values).__name__}")
        items += [f"{section}.{k}={_yaml(v)}" for k, v in values.items()]
    return items


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def pretrain(preset: str | None = None, overrides: dict[str, Any] | list[str] | None = None, *,
             resume: str | Path | None = None, callbacks: Sequence[Callback] = (), report: bool = True,
             **sections: dict[str, Any]) -> Run:
    """Train ``preset`` (a name from ``selfsup presets``, a YAML file, or a method name with ``data.root=FOLDER``:
    a recipe sized to the folder's images, ``runs.recipe``) with ``overrides``, as ``selfsup pretrain`` (which
    calls this): the run folder, the checkpoints, the exported backbone and the end-of-run report.

    ``resume=RUN`` continues the run in that folder from its last checkpoint, as ``selfsup pretrain --resume RUN``
    (which calls this too): the run's own config, of which only ``trainer.max_epochs`` / ``trainer.max_steps`` (to
    extend it) and when checkpoints are written may change (``runs.resume``); a ``preset`` given with it must agree
    with the run. A run whose training is done but whose finishing was cut short is finished; a finished one is
    left as it is.

    ``callbacks``: your own ``lightning.pytorch.Callback`` objects, put first on the run's Trainer (every session
    of the run: give them again with ``resume``). ``report=False`` skips the end-of-run report (the kNN of the
    trained and the random-init backbone; ``selfsup eval knn RUN`` gives it later)."""
    from selfsup import engine  # the Trainer and Lightning: imported when a run starts

    items = override_items(overrides, **sections)
    how: dict[str, Any] = {"callbacks": tuple(callbacks), "report": report}
    if resume is not None:
        cfg, action = resumed(Path(resume), preset, items)  # the resume rules: taken here, once
        return Run(Path(engine.pretrain(cfg, resume=Path(resume), action=action, **how)))
    if preset is None:
        raise UserError("selfsup.pretrain needs a preset name or YAML file (see `selfsup presets`), or resume=RUN")
    if is_method_name(preset) and preset not in preset_names():  # a method: a recipe sized to data.root's images
        return Run(Path(engine.pretrain(folder_recipe(preset, items), preset=preset, **how)))
    on_cpu = gpu_preset_on_cpu(preset, items)  # a GPU preset given a folder on a CPU: what runs here, printed
    items = on_cpu if on_cpu is not items else keep_grid(preset, items)  # else a preset keeps its grid of patches
    return Run(Path(engine.pretrain(load_run_config(preset, items), preset=preset, **how)))


PROTOCOLS: dict[str, tuple[Callable[..., dict], type]] = {
    "knn": (run_knn, KnnConfig), "linear": (run_linear, ProbeConfig), "finetune": (run_finetune, FinetuneConfig),
    "rankme": (run_rankme, SpectrumConfig), "norms-ood": (run_norms_ood, OodConfig),
    "segment": (run_segment, SegmentConfig)}
OOD_KEYWORDS = {"ood_root": "root", "ood_limit": "limit"}  # evaluate's names of OodConfig's (root= is the data's)


def evaluate(run: Run | str | Path, protocol: str = "knn", *, data: str | None = None,
             root: str | Path | None = None, resize: bool = False, backbone: str | None = None,
             device: str | None = None, batch_size: int = FEATURE_BATCH, out: str | Path | None = None,
             cache: bool = True, train_limit: int | None = None, embedding: str | None = None,
             flow_t: float | None = None, flow_block: int | None = None, last_blocks: int | None = None,
             mode: str | None = None, **options: Any) -> dict:
    """Evaluate a run folder, exported ``.safetensors``, ``.ckpt`` or any weights file with one protocol, as
    ``selfsup eval <protocol> RUN``; each keyword is the flag of that name (``data=``, ``root=``, ``resize=True``,
    ``backbone=`` the architecture of a bare weights file, ``device=``, ``batch_size=``, ``out=``,
    ``cache=False`` for ``--no-cache``, ``train_limit=``, ``embedding=`` (default: the backbone's; norms-ood the
    loss-side), ``flow_t=``, ``flow_block=``, ``last_blocks=``, linear's ``mode=``). ``options`` are fields of the
    protocol's config on top of the run's defaults (``KnnConfig``, ``ProbeConfig.for_method``,
    ``FinetuneConfig.for_method``, ``SpectrumConfig``, ``OodConfig`` whose ``root`` / ``limit`` are ``ood_root=`` /
    ``ood_limit=`` here, ``SegmentConfig`` whose ``root`` is ``root=``; e.g. ``evaluate(run, "knn", ks=(20,),
    val_fraction=0.2)``). Errors name these keywords.
    Returns the results dict, also written to ``RUN/eval/`` (or ``out``)."""
    if protocol not in PROTOCOLS:
        raise UserError(f"selfsup.evaluate: protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    runner, config = PROTOCOLS[protocol]
    renamed = OOD_KEYWORDS if config is OodConfig else {}
    fields = {f.name for f in dataclasses.fields(config)} - set(renamed.values()) | set(renamed)
    unknown = sorted(set(options) - fields)
    if unknown:
        raise UserError(f"selfsup.evaluate(..., {protocol!r}): unknown option(s) {', '.join(unknown)}; "
                        f"{config.__name__} has {', '.join(sorted(fields))}")
    if mode is not None and protocol != "linear":
        raise UserError(f"selfsup.evaluate(..., {protocol!r}): mode= is the linear probe's; leave it out")
    options = {renamed.get(k, k): v for k, v in options.items()}
    if protocol == "segment" and root is not None:  # the task's folder (--root), not the run's dataset
        options["root"], root = str(root), None
    location = NamedWeights(os.fspath(run), backbone) if backbone else Path(run)
    try:
        session = EvalSession(location, data=data, root=None if root is None else str(root), resize=resize,
                              device=device, batch_size=batch_size, out=None if out is None else str(out),
                              cache=cache, train_limit=train_limit, flow_t=flow_t, flow_block=flow_block,
                              embedding=embedding or ("loss" if protocol == "norms-ood" else "backbone"),
                              last_blocks=last_blocks)
        cfg = protocol_config(protocol, session, options)
        return runner(session, cfg, mode) if protocol == "linear" else runner(session, cfg)
    except UserError as e:
        raise UserError(keywords(str(e))) from None


def protocol_config(protocol: str, session: EvalSession, options: dict[str, Any]):
    """The protocol's config for ``session``: the run's defaults (its method's probe and fine-tuning), ``options``
    on top."""
    meta = session.source.meta
    if protocol == "linear":
        chosen = options.pop("protocol", None) or ProbeConfig.protocol_for(meta.get("method"))
        return ProbeConfig.for_protocol(chosen, **options)
    if protocol == "finetune":
        return FinetuneConfig.for_method(meta.get("method"), meta["backbone"], **options)
    return PROTOCOLS[protocol][1](**options)


# a flag, and the space before its value where one follows (a number, a quoted or bracketed text, a known word)
FLAG = re.compile(r"--([a-z][a-z0-9-]*)(=| (?=[-\d'\"<\[]|classes:|cpu|cuda|none\b|projector|predictor|loss\b|"
                  r"backbone\b|imagefolder|DATASET))?")
FLAG_KEYWORDS = {"no-cache": "cache=False", "resize": "resize=True", "k": "ks=", "no-feature-bn": "feature_bn=False",
                 "majority": "temperature=None"}
DATA_KEYWORDS = re.compile(r"\bdata\.(root|name)\b")


def keywords(message: str) -> str:
    """A ``selfsup eval`` error in ``selfsup.evaluate``'s words: ``--train-limit 0`` → ``train_limit=0``,
    ``--no-cache`` → ``cache=False``, the session's ``data.root`` / ``data.name`` → ``root`` / ``data``."""
    def keyword(m: re.Match) -> str:
        name = FLAG_KEYWORDS.get(m.group(1), m.group(1).replace("-", "_") + "=")
        return name if name.endswith("=") else name + (m.group(2) or "")

    message = DATA_KEYWORDS.sub(lambda m: "root" if m.group(1) == "root" else "data", message)
    return FLAG.sub(keyword, message)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def method(name: str, backbone: nn.Module, *, image_size: int, batch_size: int, num_features: int | None = None,
           channels: int = 3, mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None,
           overrides: dict[str, Any] | list[str] | None = None, **sections: dict[str, Any]):
    """A selfsup method as a LightningModule around ``backbone``, any ``nn.Module`` mapping (B, ``channels``,
    ``image_size``, ``image_size``) images to (B, D) features (timm, torchvision, your own). D is measured by one
    forward of a dummy batch (``num_features``, where given, must agree); a backbone that returns a feature map
    (B, C, H, W) is global-average pooled (``models/own.py``).

    ``name`` is a method of any family but flow's (``"byol"``: its official defaults, AdamW unless overridden;
    ``"distill"`` with ``method={"teacher": {"weights": ...}}``: a frozen teacher distilled into ``backbone``) or a
    preset (``"byol-fmnist"``: its recipe without its backbone). Give it your own ``DataLoader`` of uint8 or float
    [0, 1] image tensors (``(images, labels)`` batches or images alone; lists of PIL images or tensors are stacked) of
    ``batch_size`` images a step, all processes together (the lr scaling reads it), under your own
    ``lightning.pytorch.Trainer``. The first batch is checked (``data/inputs.py``): a float batch in 0-255, one
    already normalised, or a channel count other than ``channels`` stops with one line naming the fix. The method
    draws its views on the device (the recipe's crops, flips, colour, blur; ``mean`` / ``std`` default to
    ImageNet's for 3 channels, 0.5 / 0.25 for 1), runs its loss, schedules and EMA targets; ``backbone`` is
    trained in place. Overrides as in ``pretrain`` (``optim={"base_lr": 1e-3}``). The command line's run
    folder, checkpoints, instruments and exact resume belong to ``pretrain``; here your Trainer decides
    those."""
    from selfsup.methods.base import DataInfo, SSLMethod
    from selfsup.methods.build import build_method
    from selfsup.models.own import own_backbone

    items = override_items(overrides, **sections) + [f"data.batch_size={batch_size}"]
    joint = [m for m, cls in METHODS.items() if issubclass(cls, SSLMethod)]
    flow = (f"selfsup.method({name!r}): the flow family trains its own SiT, not your backbone (use selfsup.pretrain "
            f"for it); selfsup.method takes a joint-embedding method (the distillations included): one of "
            f"{', '.join(joint)}")
    if name in METHODS and name not in joint:
        raise UserError(flow)
    if name in preset_names() or name.endswith((".yaml", ".yml")):
        cfg = load_run_config(name, items)
    elif name in METHODS:  # the method's own defaults
        cfg = resolve(merge({"method": {"name": name}}, parse_overrides(items)))
    else:
        close = difflib.get_close_matches(name, joint, n=3) or difflib.get_close_matches(name, preset_names(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UserError(f"selfsup.method: {name!r} is neither a method nor a preset; {hint}methods: "
                        f"{', '.join(joint)}; presets: selfsup presets")
    if not issubclass(cfg.method_cls, SSLMethod):  # a flow preset
        raise UserError(flow)
    if channels < 1:
        raise UserError(f"selfsup.method: channels={channels} must be >= 1 (3 for RGB, 1 for grayscale)")
    backbone = own_backbone(backbone, channels, image_size, num_features)
    if mean is None or std is None:
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels, (0.25,) * channels)
    return build_method(cfg, DataInfo(channels, image_size, tuple(mean), tuple(std), backbone=backbone))


def embed(source: Run | str | Path, folder: str | Path, out: str | Path, **options: Any):
    """= ``selfsup embed SOURCE FOLDER --out FILE [--plot DIR]``: one row per image (path, label, features) in
    ``out`` (``selfsup.runs.embed.embed``: ``tokens``, ``half``, ``chunk``, ``device``; ``plot=DIR`` with
    ``plot_settings``: the pictures too, ``selfsup.runs.pictures.embed_with_pictures``); returns what it wrote."""
    from selfsup.runs.pictures import embed_with_pictures  # pyarrow, the decoder, matplotlib: when an embed runs

    return embed_with_pictures(source.path if isinstance(source, Run) else source, folder, out, **options)
