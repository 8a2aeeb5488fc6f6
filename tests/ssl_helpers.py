"""What the tests share (importable from spawned workers; no test module imports another or conftest):
the one tiny-run recipe (``tiny_run`` / ``TINY`` for the CLI, ``tiny_config`` / ``tiny_method`` in process),
the CLI runner and the one-line user-error checks, and the run-folder helpers of the resume tests."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from selfsup.config import resolve
from selfsup.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- the tiny run
TINY_TRAINER = {"accelerator": "cpu", "devices": 1, "progress_bar": False, "max_epochs": 1}
TINY_HEADS = {"proj_hidden_dim": 64, "pred_hidden_dim": 64, "dim": 32}  # the joint-embedding presets' heads, narrowed


def _override(section: str, values: dict) -> list[str]:
    return [f"{section}.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def tiny_run(batches: int = 2, batch_size: int = 64, heads: bool = True) -> list[str]:
    """CLI overrides for a seconds-long run of a preset on one CPU: one epoch of ``batches`` batches, logged every
    step; ``heads``: narrow a joint-embedding preset's heads (flow presets have none). Later overrides win, so a
    test appends what it changes (``output_dir=...``, ``name=...``, more epochs)."""
    return [*(_override("method", TINY_HEADS) if heads else []), f"data.batch_size={batch_size}",
            *_override("trainer", TINY_TRAINER), f"trainer.limit_train_batches={batches}",
            "trainer.log_every_n_steps=1"]


TINY = tiny_run()  # a joint-embedding preset, 2 steps
FLOW_TINY = tiny_run(batches=3, heads=False)  # a flow preset, 3 steps

METHOD_NAMES = ("moco_v3", "byol", "simsiam", "simclr")

HEADS = {
    "moco_v3": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=64, temperature=0.2),
    "byol": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=64),
    "simsiam": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=32),
    "simclr": dict(proj_hidden_dim=64, dim=32, temperature=0.2),
    "barlow_twins": dict(proj_hidden_dim=64, dim=32),
    "vicreg": dict(proj_hidden_dim=64, dim=32),
    "dino": dict(out_dim=64, hidden_dim=32, bottleneck_dim=16),
    "dinov2": dict(out_dim=64, hidden_dim=32, bottleneck_dim=16, ibot_out_dim=64, ibot_hidden_dim=32,
                   ibot_bottleneck_dim=16),  # the defaults are 65,536 prototypes behind 2,048-wide layers
    "ibot": dict(out_dim=64, patch_out_dim=48, hidden_dim=32, bottleneck_dim=16),
    "mae": dict(decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2),
    "swav": dict(hidden_mlp=32, feat_dim=16, nmb_prototypes=24),
    "wmse": dict(head_size=32, emb=4, w_size=8),
    "nnclr": dict(proj_hidden_dim=64, dim=32, pred_hidden_dim=64, queue_size=40),
    "moco_v2": dict(proj_hidden_dim=64, dim=32, queue_size=48),
    "tico": dict(proj_hidden_dim=64, dim=32),
    "ijepa": dict(pred_depth=1, pred_emb_dim=32, pred_num_heads=4, min_keep=1, pred_mask_scale=[0.2, 0.3],
                  num_pred_masks=2),
    "lejepa": dict(proj_hidden_dim=32, proj_dim=8, num_slices=16),
}
MODEL = {"ijepa": {"class_token": False, "pool": "avg"}}  # a method's own backbone settings (I-JEPA's ViT)


def nano(preset: str, overrides: list[str] = ()) -> list[str]:
    """``model.backbone=vit_nano`` where ``preset`` (with ``overrides``) trains the micro ViT, else nothing: the
    tests that compare a run's state with another's (resume, kill) need no width, and the micro ViT's blocks are
    half of such a run's CPU time (a ConvNet or a flow preset keeps its own network)."""
    from selfsup.config import load_run_config

    return ["model.backbone=vit_nano"] if load_run_config(preset, list(overrides)).model.backbone == "vit_micro" else []


def tiny_config(method: str, method_extra: dict | None = None, **sections):
    """A resolved RunConfig: micro ViT (8×8, patch 2, frozen patch projection), narrow heads, digits."""
    data = {
        "method": {"name": method, **HEADS.get(method, {}), **(method_extra or {})},  # a new method: its defaults
        "data": {"name": "digits", "batch_size": 16},
        "model": {"backbone": "vit_micro", "patch_size": 2, "stop_grad_conv1": True, **MODEL.get(method, {})},
        "optim": {"name": "adamw", "base_lr": 1e-3, "weight_decay": 0.05, "warmup_epochs": 0},
        "trainer": dict(TINY_TRAINER),
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return resolve(data)


def tiny_method(method: str, method_extra: dict | None = None, **sections):
    from selfsup.methods.build import build_method
    from selfsup.methods import DataInfo

    return build_method(tiny_config(method, method_extra, **sections), DataInfo(1, 8, (0.5,), (0.25,)))


def random_views(batch: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 1, 8, 8, generator=g), torch.randn(batch, 1, 8, 8, generator=g)]


# --------------------------------------------------------------------------- the CLI and its user errors
def filled_tensors(out) -> dict[str, torch.Tensor]:
    """The tensors of a StepOutput that its step filled, by attribute name (the loss included)."""
    import dataclasses

    return {f.name: getattr(out, f.name) for f in dataclasses.fields(out)
            if isinstance(getattr(out, f.name), torch.Tensor)}


def step_outputs(**tensors) -> dict:
    """What Lightning hands a callback after a training step: ``{"loss", "step": StepOutput(...)}``."""
    from selfsup.step import StepOutput

    loss = torch.zeros(())
    return {"loss": loss, "step": StepOutput(loss, **tensors)}


def run_cli(*argv, callbacks=()):
    """main(argv) in this process (``callbacks``: on a pretrain's Trainer): (exit code, stdout, stderr)."""
    from selfsup.commands.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv], callbacks=callbacks)
    return code, out.getvalue(), err.getvalue()


def assert_user_error(code, err, *words, only_line=True):
    """The CLI's user error: exit 2, the message on one stderr line starting 'selfsup: error:' and naming each
    of ``words``, no traceback (``only_line``: nothing else on stderr)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("selfsup: error:")]
    assert len(lines) == 1, err
    if only_line:
        assert err.strip() == lines[0], err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def raises_user_error(*words):
    """``pytest.raises(UserError, match=...)`` on the first of ``words`` (literal text), whose message is one line
    naming every one of them: what the CLI prints after 'selfsup: error:'."""
    assert words, "name at least the thing the message must mention"
    with pytest.raises(UserError, match=re.escape(words[0])) as e:
        yield e
    assert_user_error(2, f"selfsup: error: {e.value}", *words)


# --------------------------------------------------------------------------- run folders (resume tests)
# 3 batches per epoch, 2 epochs, warmup over the first epoch: lr and momentum change every step,
# so a resume that saw another total step count or another step index would differ.
# the resume tests' run: 2 epochs of 3 steps on the smallest ViT (its state is what they compare, not its width)
RESUME = TINY + ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "optim.warmup_epochs=1",
                 "model.backbone=vit_nano"]


class CtrlCAtStep(pl.Callback):
    """A Ctrl-C before training step ``step`` (0-based): the last checkpoint is the one after ``step`` steps."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def interrupt_at(cfg, step: int = 4) -> None:
    """``engine.pretrain(cfg)`` stopped by a Ctrl-C before training step ``step``: its last checkpoint then holds
    ``step`` steps (with ``trainer.checkpoint_every_n_steps=1``)."""
    import selfsup.engine as engine

    with pytest.raises(KeyboardInterrupt):
        engine.pretrain(cfg, callbacks=[CtrlCAtStep(step)])


class StopAfterEpoch(pl.Callback):
    """Ends fit cleanly at the end of the first epoch (the epoch-end checkpoint is still written)."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            trainer.should_stop = True


def ckpt(run_dir):
    """The run's last checkpoint (selfsup writes only plain types: loaded weights-only)."""
    return torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


class SigkillAt(pl.Callback):
    """SIGKILLs its own process (no shutdown hook runs, nothing is flushed) before training step ``step``
    (``where="start"``: after the checkpoint of ``step`` steps) or right after it (``"end"``: after its optimiser
    step and post-step updates, before its checkpoint is written)."""

    def __init__(self, step: int, where: str = "start"):
        self.step, self.where = step, where

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.where == "start" and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.where == "end" and trainer.global_step == self.step + 1:
            os.kill(os.getpid(), signal.SIGKILL)


def forked_session(cfg_or_run, step: int | None = None, where: str = "start", quiet: bool = False) -> int:
    """``engine.pretrain`` of a config (a fresh run) or of a run folder (resumed) in a forked child, SIGKILLed at
    ``step`` / ``where`` (``SigkillAt``; None: trained to the end); the child's wait status (exit 0: it finished,
    3: it failed). Cheap: no new interpreter. ``quiet``: the child's output goes to /dev/null."""
    import selfsup.engine as engine

    pid = os.fork()
    if pid == 0:  # the child
        code = 3  # unless training ends normally
        try:
            if quiet:
                sys.stdout = sys.stderr = open(os.devnull, "w")
            callbacks = [] if step is None else [SigkillAt(step, where)]
            os.environ.pop("SELFSUP_RUN_DIR", None)
            if isinstance(cfg_or_run, Path):
                engine.pretrain(engine.load_run(cfg_or_run), resume=cfg_or_run, callbacks=callbacks)
            else:
                engine.pretrain(cfg_or_run, callbacks=callbacks)
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def forked_kill(cfg_or_run, step: int, where: str = "start") -> None:
    """``forked_session`` that must end by its SIGKILL."""
    status = forked_session(cfg_or_run, step, where)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child ended with status {status}"


def ckpt_step(run_dir: Path) -> int:
    """The global step of a run's last checkpoint."""
    return int(torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"])


def assert_same_run(a, b, momentum: bool = True):
    """Two 6-step runs (``RESUME``: MoCo v3) with the same weights, momentum encoder (``momentum``: the method
    has one), optimiser state, lr, exported backbone and logged losses."""
    from safetensors.torch import load_file

    ca, cb = ckpt(a), ckpt(b)
    assert ca["global_step"] == cb["global_step"] == 6
    sa, sb = ca["state_dict"], cb["state_dict"]
    assert sa.keys() == sb.keys()
    if momentum:
        assert (any(k.startswith("momentum_backbone.") for k in sa)
                and any(k.startswith("momentum_projector.") for k in sa))
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-6, rtol=0, msg=lambda m: f"{k}: {m}")
    oa, ob = ca["optimizer_states"][0], cb["optimizer_states"][0]
    assert oa["state"].keys() == ob["state"].keys() and len(oa["state"]) > 0
    for i in oa["state"]:
        for name, value in oa["state"][i].items():
            torch.testing.assert_close(value, ob["state"][i][name], atol=1e-6, rtol=0)
    assert [g["lr"] for g in oa["param_groups"]] == pytest.approx([g["lr"] for g in ob["param_groups"]], rel=1e-12)
    ba, bb = load_file(str(Path(a) / "backbone.safetensors")), load_file(str(Path(b) / "backbone.safetensors"))
    for k in ba:
        torch.testing.assert_close(ba[k], bb[k], atol=1e-6, rtol=0)
    # the resumed run's metrics.csv keeps the first half and continues it with the same losses
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(6))
    assert lb == pytest.approx(la, abs=1e-5)


def losses(run_dir):
    """step → train/loss of a run's metrics.csv."""
    import csv

    with (Path(run_dir) / "metrics.csv").open(newline="") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def mfu_benchmark():
    """The ``benchmarks.mfu`` module (the repository root is on the tests' path: pyproject's ``pythonpath``)."""
    import benchmarks.mfu

    return benchmarks.mfu


MULTICROP = {"local_crops_number": 2, "local_crops_size": 4}  # a 2 global + 2 local view plan on 8x8 digits


def tiny_dino(method_extra=None, **sections):
    """A tiny DINO on the 2 + 2 crop plan (``tiny_config``'s micro ViT)."""
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    sections.setdefault("augment", MULTICROP)
    return build_method(tiny_config("dino", method_extra, **sections), DataInfo(1, 8, (0.5,), (0.25,)))


# --------------------------------------------------------------------------- DDP equivalence tests
def batchnorm_eval(method: torch.nn.Module) -> torch.nn.Module:
    """Training mode with every BatchNorm in eval mode (its statistics would differ between one process and two:
    CPU processes keep their own, torch's SyncBatchNorm runs on GPUs only)."""
    method.train()
    for mod in method.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.eval()
    return method


class ViewsLoss(torch.nn.Module):
    """A method's loss as ``forward``, where DDP arms its gradient hooks: ``forward_views(views)``, plus MAE's
    mask ``noise`` after its one view when given."""

    def __init__(self, method: torch.nn.Module):
        super().__init__()
        self.method = method

    def forward(self, *views, noise=None):
        return self.method.forward_views(list(views), *(() if noise is None else (noise,))).loss


def quick_claim(claim_id: str, work, overrides) -> dict:
    """Run one claim in quick mode, one seed, on ``overrides``; its verdict must follow from its rules and
    every rule's metric must be measured."""
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Context, run_claim, verdict

    claim = CLAIMS[claim_id]
    result = run_claim(claim, Context(quick=True, seeds=1, work=work, overrides=list(overrides),
                                      progress=lambda m: None))
    assert result["verdict"] in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    assert result["verdict"] == verdict(claim.rules, result["metrics"], claim.deterministic)
    assert {r.metric for r in claim.rules} <= set(result["metrics"])
    return result


def in_fresh_interpreter(module: str, function: str, *args: str, timeout: float = 900) -> None:
    """``module.function(*args)`` (a tests/ module, string arguments) in a new process, failing the caller with the
    child's traceback. For tests that run a compiled backward: it starts autograd's device threads, and a process
    that did so can no longer fork a child that runs backward (``forked_kill``: "Unable to handle autograd's
    threading in combination with fork-based multiprocessing"), so such a test must not run in the suite's process.
    The process is a fork of the clean fork server of ``spawn.forkserver`` (a new interpreter that has only imported
    torch, Lightning and the engine: none of the suite process's threads or state), not one more interpreter start."""
    import tempfile

    from spawn import run_forked

    with tempfile.TemporaryDirectory() as tmp:
        error = Path(tmp) / "traceback.txt"
        try:
            exitcode = run_forked(_call, (module, function, args, str(error)), timeout, f"{module}.{function}")
        except TimeoutError as e:
            raise AssertionError(str(e)) from None
        assert exitcode == 0, error.read_text()[-4000:] if error.exists() else f"exit code {exitcode}"


def _call(module: str, function: str, args: tuple, error: str) -> None:
    """The child of :func:`in_fresh_interpreter`: its traceback to ``error``, exit code 1 on a failure."""
    import importlib
    import traceback

    try:
        getattr(importlib.import_module(module), function)(*args)
    except BaseException:
        Path(error).write_text(traceback.format_exc())
        sys.exit(1)


def checks_in_one_fresh_interpreter(module: str, functions: list[str], tmp: Path) -> dict[str, str | None]:
    """Each ``module.function(DIR)`` (``DIR``: its own new folder under ``tmp``) in one new process, as
    :func:`in_fresh_interpreter` runs one, paying its start (dynamo's first use among it) once for all: function →
    None (passed) or its traceback, for each test to assert its own. Dynamo is reset before each."""
    import json

    in_fresh_interpreter("ssl_helpers", "run_checks", module, str(tmp), *functions)
    return json.loads((Path(tmp) / "checks.json").read_text())


def run_checks(module: str, tmp: str, *functions: str) -> None:
    """The child of :func:`checks_in_one_fresh_interpreter`: a failing check is recorded, the next still runs."""
    import importlib
    import json
    import traceback

    mod = importlib.import_module(module)
    results = {}
    for name in functions:
        folder = Path(tmp) / name
        folder.mkdir(parents=True)
        torch._dynamo.reset()
        try:
            getattr(mod, name)(str(folder))
            results[name] = None
        except Exception:  # noqa: BLE001  (reported by the check's own test)
            results[name] = traceback.format_exc()[-4000:]
    (Path(tmp) / "checks.json").write_text(json.dumps(results))


# --------------------------------------------------------------------------- a DINOv2 teacher run (distill_dinov2)
TEACHER_HEADS = {"out_dim": 32, "hidden_dim": 32, "bottleneck_dim": 16, "ibot_out_dim": 24, "ibot_hidden_dim": 32,
                 "ibot_bottleneck_dim": 16}  # a teacher's heads, narrowed
STUDENT_HEADS = {"hidden_dim": 24, "bottleneck_dim": 8, "ibot_hidden_dim": 24, "ibot_bottleneck_dim": 8}


def dinov2_teacher_run(folder, backbone: str = "vit_micro", seed: int = 0, norm=((0.5,), (0.25,)),
                       **method_extra) -> Path:
    """A selfsup DINOv2 run folder standing in for a trained teacher (``distill_dinov2``'s ``method.teacher.weights``):
    a seeded tiny DINOv2 on digits (8 px, patch 2, ``tiny_config``'s) with its teacher moved off its student copy and
    non-zero centres, its teacher exported as ``backbone.safetensors`` (its metadata as a run's) and its state as
    ``checkpoints/last.ckpt``; no training. ``norm``: the (mean, std) its data had. Made once per folder and
    arguments."""
    from selfsup.export import export_backbone
    from selfsup.methods import DataInfo
    from selfsup.methods.build import backbone_meta, build_method

    tag = "-".join(f"{k}{v}" for k, v in sorted(method_extra.items())) + ("" if norm == ((0.5,), (0.25,)) else
                                                                         f"norm{norm[0][0]}-{norm[1][0]}")
    run = Path(folder) / f"dinov2-teacher-{backbone}-{seed}{'-' + tag if tag else ''}"
    if (run / "checkpoints" / "last.ckpt").exists():
        return run
    info = DataInfo(1, 8, tuple(norm[0]), tuple(norm[1]))
    cfg = tiny_config("dinov2", {**TEACHER_HEADS, **method_extra}, model={"backbone": backbone})
    m = build_method(cfg, info)  # seeded by trainer.seed
    torch.manual_seed(seed)
    with torch.no_grad():  # a teacher that is not its student's init, with centres of its own
        for name, p in (*m.teacher_backbone.named_parameters(), *m.teacher_head.named_parameters()):
            if name != "pos_embed":  # a fixed sin-cos table stays the table
                p.add_(torch.randn_like(p) * 0.02)
        m.center.normal_(0, 0.3)
        m.center2.normal_(0, 0.3)
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    export_backbone(m.eval_backbone, run / "backbone.safetensors", backbone_meta(cfg, info))
    torch.save({"state_dict": m.state_dict(), "global_step": 0}, run / "checkpoints" / "last.ckpt")
    return run
