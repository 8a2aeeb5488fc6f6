"""``selfsup export RUN --format hf --out DIR``: a folder in timm's Hugging Face hub layout, loaded offline by plain
timm without selfsup (docs/export.md, "A hub-ready folder").

``config.json`` is timm's hub config: ``architecture`` (the timm class label), ``num_classes`` 0, ``num_features``,
``global_pool``, ``model_args`` (every constructor argument: timm's ``local-dir:`` / ``hf-hub:`` loaders pass them to
``create_model``) and ``pretrained_cfg`` (input size, mean, std, interpolation, crop as selfsup evaluates, licence).
``model.safetensors`` holds the backbone under timm's keys (``export.timm_state``); ``README.md`` is the model card:
the method, data, steps, the end-of-run kNN against the start (``knn.json``) and the licence of the start's weights
where the run began from ``model.weights``, else the project's. Before anything is written the timm model is built
from the folder's own recipe and checked against selfsup's backbone (``portable.max_rel_diff`` under
``portable.TOLERANCE``). A backbone timm cannot build is refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from selfsup.data.decode import EVAL_CROP
from selfsup.diskspace import write_text
from selfsup.errors import UserError
from selfsup.export import architecture, hub_model, hub_recipe, timm_module, timm_state, write_safetensors
from selfsup.runs.facts import read_run_facts
from selfsup.runs.portable import TOLERANCE, max_rel_diff
from selfsup.runs.source import EvalSource, load_source

HUB_FILES = ("config.json", "model.safetensors", "README.md")
# selfsup's pyproject.toml declares no licence: a card of weights trained from scratch says so (--license sets one)
PROJECT_LICENCE = ("other", "selfsup's own; the project declares no licence (pyproject.toml): choose one with "
                            "--license before publishing")
DINOV2_LICENCE = ("apache-2.0", "DINOv2's weights are Apache 2.0 (the dinov2 repository's LICENSE)")


@dataclass
class HubFolder:
    """The folder written, its timm recipe, the check's largest relative difference."""

    path: Path
    config: dict
    max_rel_diff: float


def start_licence(start: dict | None) -> tuple[str, str]:
    """(the hub's licence id, in words) of the weights a run started from (run.json's ``weights``): DINOv2's,
    a timm model's (its ``pretrained_cfg``), else unknown; a random init or a selfsup start: the project's."""
    if not isinstance(start, dict) or start.get("kind") == "selfsup":
        return PROJECT_LICENCE
    if start.get("kind") == "dinov2-hub" or start.get("layout") == "dinov2":
        return DINOV2_LICENCE
    if start.get("kind") == "timm":
        name = str(start.get("path") or start.get("source")).removeprefix("timm:")
        cfg = timm_module().models.get_pretrained_cfg(name)
        if cfg is not None and cfg.license:
            return cfg.license, f"the start, timm's {name}, is {cfg.license} (its pretrained_cfg)"
    return "other", (f"unknown: the start's weights ({start.get('source')}) state no licence here; "
                     "check theirs before publishing")


def hub_config(source: EvalSource, recipe: dict, licence: str) -> dict:
    """timm's ``config.json`` of the folder (``timm.models._hub``'s layout)."""
    m, backbone = source.meta, source.backbone
    default = timm_module().models.get_pretrained_cfg(recipe["model"])  # the class's own first conv and classifier
    size, channels = int(m["image_size"]), int(m.get("in_chans", 3))
    pool = recipe["kwargs"].get("global_pool") or getattr(backbone, "global_pool", None) or "avg"
    pool = pool if isinstance(pool, str) else getattr(pool, "pool_type", "avg")  # a timm CNN's pooling module
    return {"architecture": recipe["model"], "num_classes": 0, "num_features": int(backbone.num_features),
            "global_pool": pool, "model_args": recipe["kwargs"],
            "pretrained_cfg": {"tag": "selfsup", "custom_load": False, "input_size": [channels, size, size],
                               "fixed_input_size": bool(getattr(default, "fixed_input_size", False)),
                               "interpolation": "bilinear", "crop_pct": EVAL_CROP, "crop_mode": "center",
                               "mean": list(m["mean"]), "std": list(m["std"]), "num_classes": 0, "pool_size": None,
                               "first_conv": getattr(default, "first_conv", None),
                               "classifier": getattr(default, "classifier", None), "license": licence}}


def _knn_rows(knn: dict | None) -> list[str]:
    if not knn or "pretrained" not in knn:
        return ["| kNN | not measured at the end of the run (no knn.json) |"]
    labels = knn.get("labels", {})
    start = labels.get("random_init", "random init").replace("_", " ")
    k = f"k={knn.get('k')}, {knn.get('test_size')} images ({knn.get('scored_on', 'test')})"
    return [f"| kNN top-1, {k} | {knn['pretrained']['top1']:.2f}% trained, {knn['random_init']['top1']:.2f}% "
            f"at its {start} |"]


def model_card(source: EvalSource, config: dict, licence: tuple[str, str]) -> str:
    """The README.md: hub front matter, what was trained on what, the kNN against its start, how to load it."""
    run = source.run_dir
    facts = read_run_facts(run) if run else {}
    knn = json.loads((run / "knn.json").read_text()) if run and (run / "knn.json").exists() else None
    m, data = source.meta, getattr(source.run_cfg, "data", None)
    method = m.get("method") or "?"
    dataset = (f"{data.name}" + (f" ({data.root})" if data.root else "")) if data else m.get("dataset", "?")
    start = facts.get("weights")
    name = run.name if run else source.weights.stem
    rows = [f"| method | {method} (selfsup) |", f"| data | {dataset} |",
            f"| steps | {facts.get('global_step', '?')} ({facts.get('epochs', '?')} epochs) |",
            f"| backbone | selfsup {m.get('backbone')}, {config['num_features']} features, "
            f"timm global_pool {config['global_pool']} |",
            f"| input | {' x '.join(map(str, config['pretrained_cfg']['input_size']))}, mean {m['mean']}, "
            f"std {m['std']} |",
            f"| start | {start.get('source') if isinstance(start, dict) else 'random init'} |",
            *_knn_rows(knn), f"| licence | {licence[0]}: {licence[1]} |"]
    return "\n".join([
        "---", "library_name: timm", f"license: {licence[0]}", "pipeline_tag: image-feature-extraction",
        "tags:", "- image-feature-extraction", "- timm", "- selfsup", f"- {method}", "---", "",
        f"# {name}", "", f"A {method} backbone pretrained by selfsup, without labels, in timm's layout "
        f"(`{config['architecture']}` with the `model_args` of config.json).", "",
        "| | |", "|---|---|", *rows, "", "## Use", "", "```python", "import timm", "",
        "model = timm.create_model('local-dir:PATH/TO/THIS/FOLDER', pretrained=True).eval()  # offline",
        "# or, once uploaded: timm.create_model('hf-hub:USER/NAME', pretrained=True)",
        "features = model(images)  # (batch, num_features), images normalised by pretrained_cfg's mean and std",
        "```", ""])


def export_hub(location, out, *, license: str | None = None, check: bool = True) -> HubFolder:
    """Write ``location``'s backbone (anything ``selfsup eval`` accepts) as a timm hub folder at ``out``."""
    source = location if isinstance(location, EvalSource) else load_source(location)
    backbone = source.backbone.cpu().float().eval()
    arch = architecture(backbone)
    recipe, why = hub_recipe(arch)
    if recipe is None:
        raise UserError(f"--format hf: {source.weights} holds a {source.meta.get('backbone')} that timm cannot "
                        f"build ({why}); use --format onnx, or its selfsup .safetensors (docs/export.md's rebuild)")
    state = timm_state(backbone, arch)
    licence = start_licence(read_run_facts(source.run_dir).get("weights") if source.run_dir else None)
    if license:
        licence = (license, "set by --license")
    config = hub_config(source, recipe, licence[0])
    worst = float("nan")
    if check:
        model = hub_model(recipe, state)
        size, channels = int(source.meta["image_size"]), int(source.meta.get("in_chans", 3))
        with torch.no_grad():
            worst = max_rel_diff(model, backbone, size, channels)
        if not worst < TOLERANCE:
            raise UserError(f"the hf folder's timm model differs from selfsup's backbone by {worst:.2e} of the "
                            f"features' scale (over {TOLERANCE:g}); report it, or use --format onnx")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; --format hf writes a folder ({', '.join(HUB_FILES)})")
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(state, {"format": "pt"}, out / "model.safetensors", "the hub folder's weights")
    write_text(out / "config.json", json.dumps(config, indent=2) + "\n", "the hub folder's config")
    write_text(out / "README.md", model_card(source, config, licence), "the hub folder's model card")
    return HubFolder(out, config, worst)
