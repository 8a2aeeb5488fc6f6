"""``selfsup embed SOURCE FOLDER --out FILE`` (``runs.embed``) and ``selfsup export SOURCE --format onnx|torchscript``
(``runs.portable``) or ``--format hf`` (``runs.hub``): what leaves selfsup (docs/embed.md, docs/export.md)."""

from __future__ import annotations

from pathlib import Path

from selfsup.errors import UserError
from selfsup.eval.pictures import MAP_METHODS
from selfsup.runs.embed import CHUNK, FORMATS, TOKENS
from selfsup.runs.hub import HUB_FILES, export_hub
from selfsup.runs.pictures import PictureSettings, embed_with_pictures
from selfsup.runs.portable import OPSET, PORTABLE_FORMATS, TOLERANCE, export_portable

SOURCE_HELP = "a run folder, an exported backbone .safetensors, a run's .ckpt or a model.weights file"


def cmd_embed(args) -> int:
    """Embed the folder; the file, its rows and the images per second."""
    done = embed_with_pictures(args.source, args.folder, args.out, tokens=args.tokens, half=args.half,
                               chunk=args.chunk, device=args.device, plot=args.plot,
                               plot_settings=PictureSettings(seed=args.seed, method=args.map))
    skipped = f", {done.skipped} unreadable images skipped" if done.skipped else ""
    print(f"embed: {done.rows} rows → {done.out}{skipped} ({done.seconds:.1f} s, {done.images_per_s:.0f} images/s)")
    if done.pictures is not None:
        print(f"embed: pictures → {args.plot}/ ({', '.join(done.pictures)})")
    return 0


def add_embed_parser(p) -> None:
    """``selfsup embed``'s arguments on its parser ``p`` (made by ``commands.main``)."""
    p.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument("folder", metavar="FOLDER_OR_SHARDS",
                   help="a folder of images: flat, <class>/ or train/<class>/ (labelled); or .tar shards")
    p.add_argument("--out", required=True, type=Path,
                   help=f"the file; its suffix is the format: {', '.join(FORMATS)} (the last two with a .csv beside)")
    p.add_argument("--tokens", choices=TOKENS, default=None,
                   help="add a ViT's tokens: its class token, mean patch token or (patch) all N×D patch tokens")
    p.add_argument("--half", action="store_true", help="store the features and tokens as float16")
    p.add_argument("--chunk", type=int, default=CHUNK,
                   help=f"images per chunk, the unit a killed embed resumes from (default {CHUNK})")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--plot", type=Path, default=None, metavar="DIR",
                   help="also draw the embedding's pictures in DIR: a 2-D map (by label where labelled), nearest "
                        "neighbours of a few images, a ViT's patch tokens as RGB (PCA)")
    p.add_argument("--map", choices=MAP_METHODS, default="auto",
                   help="--plot's map: umap (umap-learn), tsne (scikit-learn), auto (default: umap where installed)")
    p.add_argument("--seed", type=int, default=0, help="--plot's seed: the map and the query images (default 0)")
    p.set_defaults(func=cmd_embed)


def cmd_export_hf(args) -> int:
    """``--format hf``: the hub folder (default RUN/hf, or beside a file: <stem>-hf), checked against selfsup."""
    given = [flag for flag, value, default in (("--normalize", args.normalize, "in"), ("--image-size",
             args.image_size, None), ("--opset", args.opset, OPSET)) if value != default]
    if given:
        raise UserError(f"{', '.join(given)} applies to --format onnx|torchscript; a hub folder holds the model at "
                        "its own size, normalisation in config.json's pretrained_cfg: leave it out")
    source = Path(args.source)
    out = args.out or (source / "hf" if source.is_dir() else source.with_name(f"{source.stem}-hf"))
    done = export_hub(args.source, out, license=args.license)
    print(f"export: {done.path}/ ({', '.join(HUB_FILES)}; timm {done.config['architecture']} with its model_args; "
          f"max |diff| vs selfsup {done.max_rel_diff:.1e} of the features' scale)")
    return 0


def cmd_export(args) -> int:
    """Export and check; the file, the check's difference."""
    if args.format == "hf":
        return cmd_export_hf(args)
    if args.license is not None:
        raise UserError(f"--license applies to --format hf (the model card's licence), not {args.format}: leave it out")
    suffix = ".onnx" if args.format == "onnx" else ".pt"
    source = Path(args.source)
    out = args.out or (source / f"backbone{suffix}" if source.is_dir() else source.with_suffix(suffix))
    done = export_portable(args.source, out, args.format, normalize=args.normalize == "in",
                           image_size=args.image_size, opset=args.opset)
    print(f"export: {done.path} ({done.format}, normalisation {done.meta['normalization']}, "
          f"{done.meta['image_size']} px, batch dynamic; max |diff| vs eager {done.max_rel_diff:.1e} of the "
          f"features' scale)")
    return 0


def add_export_parser(p) -> None:
    """``selfsup export``'s arguments on its parser ``p``."""
    p.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument("--format", choices=(*PORTABLE_FORMATS, "hf"), default="onnx",
                   help="onnx (default), torchscript, or hf: a folder in timm's hub layout (config.json, "
                        "model.safetensors, README.md)")
    p.add_argument("--out", type=Path, default=None,
                   help="the file (default: RUN/backbone.onnx|.pt for a run folder, else SOURCE with that suffix); "
                        "--format hf: the folder (default RUN/hf, else SOURCE's stem + -hf)")
    p.add_argument("--license", default=None,
                   help="--format hf: the model card's licence id (default: the start's weights', else the project's)")
    p.add_argument("--normalize", choices=("in", "out"), default="in",
                   help="in (default): the graph normalises RGB inputs in [0, 1] by the model's mean and std; "
                        "out: inputs come normalised (the metadata states mean and std)")
    p.add_argument("--image-size", type=int, default=None,
                   help="input size (default: the model's; a ViT's position table is resampled to another)")
    p.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    p.set_defaults(func=cmd_export)
    p.epilog = f"checked against eager PyTorch on export: max |diff| under {TOLERANCE:g} of the features' scale"
