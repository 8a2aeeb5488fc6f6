"""trainer.compile=true: the step forward (EMA update, every view, heads, loss) is one graph, with no graph break
and no recompilation over steps, epochs, crop sizes and micro-batches; a compiled run resumes bit for bit.

The checks run in a new interpreter, all in one (``checks_in_one_fresh_interpreter``): a compiled backward starts
autograd's device threads, after which the suite's process could not fork the SIGKILLed runs of test_kill_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from ssl_helpers import StopAfterEpoch, checks_in_one_fresh_interpreter, tiny_config

# what changes between steps, per method: the cosine momentum (every step), τt and τt2 warm-ups (every epoch), the
# micro-batch of an accumulated step (MoCo v3), two crop sizes in one step (DINO, iBOT), masks and mask noise,
# W-MSE's sub-batch permutations, SwAV's codes, NNCLR's support set
CASES = {
    "moco_v3": ({}, {"accumulate_grad_batches": 2}, {}),
    "byol": ({}, {}, {}),
    "simsiam": ({}, {}, {}),
    "simclr": ({"projector_momentum": 0.9}, {}, {}),
    "barlow_twins": ({}, {}, {}),
    "vicreg": ({}, {}, {}),
    "dino": ({"warmup_teacher_temp_epochs": 2}, {}, {"local_crops_number": 2, "local_crops_size": 4}),
    "ibot": ({"warmup_teacher_temp_epochs": 2, "pred_ratio": [0.0, 0.3], "pred_ratio_var": [0.0, 0.2]}, {},
             {"local_crops_number": 2, "local_crops_size": 4}),
    "dinov2": ({"warmup_teacher_temp_epochs": 1, "freeze_last_layer": 1}, {},
               {"local_crops_number": 2, "local_crops_size": 4}),  # τt per iteration, the last layer's lr 0 → lr
    "dinov3": ({"warmup_teacher_temp_epochs": 1, "freeze_last_layer": 1, "gram_img_level": True}, {},
               {"local_crops_number": 2, "local_crops_size": 4}),  # + the Gram teacher and term from step 0
    "mae": ({}, {}, {}),
    "swav": ({}, {}, {}),
    "wmse": ({"emb": 8, "w_size": 16, "head_size": 32}, {}, {}),  # its permutations: step_draws
    "nnclr": ({}, {}, {}),
    "moco_v2": ({}, {}, {}),  # its queue's enqueue in the step
    "tico": ({}, {}, {}),  # its running covariance C in the step
    "lejepa": ({}, {}, {}),  # its slices: step_draws
    "distill": ({"queue_size": 32}, {}, {}),  # the queue, mixup's λ and permutation (step_draws), a frozen teacher
    # LightlyTrain's v3: both networks' feature maps, the student's resized to the teacher's grid, the local term
    "distill_v3": ({"queue_size": 32, "version": "v3"}, {}, {}),
    # a frozen teacher with heads outside the module tree, every patch of the global crops, the spare EMA
    "distill_dinov2": ({"warmup_teacher_temp_epochs": 1, "freeze_last_layer": 1}, {},
                       {"local_crops_number": 2, "local_crops_size": 4}),
}
NANO = {"backbone": "vit_nano"}
VARIANTS = {"distill_v3": "distill"}  # a case of another version of a registered method: the method's name


def fit(cfg, run_dir: Path, ckpt_path=None, callbacks=()):
    from selfsup.data.datasets import load_dataset
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train))
    trainer = make_trainer(cfg, run_dir)
    trainer.callbacks[:0] = list(callbacks)
    trainer.fit(model, datamodule=PretrainData(cfg, train), ckpt_path=ckpt_path)
    return model, trainer


@pytest.fixture(scope="module")
def compiled_checks(tmp_path_factory) -> tuple[dict, dict]:
    """Every case's check (``check_one_graph``) and the compiled resume's, in one new interpreter: (method -> None
    (passed) or the error, check -> None or the error)."""
    import json

    tmp = tmp_path_factory.mktemp("compiled")
    checks = checks_in_one_fresh_interpreter("test_compile", ["check_every_case", "check_compiled_resume"], tmp)
    assert checks["check_every_case"] is None, checks["check_every_case"]
    return json.loads((tmp / "check_every_case" / "results.json").read_text()), checks


@pytest.fixture(scope="module")
def one_graph_results(compiled_checks) -> dict:
    return compiled_checks[0]


@pytest.mark.spawn
@pytest.mark.parametrize("method", list(CASES))
def test_the_compiled_step_is_one_graph_that_never_recompiles(one_graph_results, method):
    """2 epochs of 2 steps (backend eager: dynamo's capture alone, what breaks and recompiles): fullgraph makes a
    graph break an error, ``error_on_recompile`` a recompilation."""
    assert one_graph_results[method] is None, one_graph_results[method]


def check_every_case(tmp: str) -> None:
    import json
    import traceback

    results = {}
    for method in CASES:
        try:
            check_one_graph(method, str(Path(tmp) / method))
            results[method] = None
        except Exception:  # noqa: BLE001  (reported by the case's own test)
            results[method] = traceback.format_exc()[-3000:]
    (Path(tmp) / "results.json").write_text(json.dumps(results))


def check_one_graph(method: str, tmp: str) -> None:
    tmp_path = Path(tmp)
    method_extra, trainer, augment = CASES[method]
    method = VARIANTS.get(method, method)
    if method == "distill":  # its frozen teacher: a random-init micro ViT exported to a file
        from selfsup.export import export_backbone
        from selfsup.models.backbones import build_backbone

        kwargs = dict(in_chans=1, image_size=8, patch_size=4)
        meta = {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3],
                "std": [0.3], "dataset": "digits", "method": "moco_v3"}
        tmp_path.mkdir(parents=True, exist_ok=True)
        teacher = export_backbone(build_backbone("vit_micro", **kwargs), tmp_path / "teacher.safetensors", meta)
        method_extra = {**method_extra, "teacher": {"weights": str(teacher)}}
    if method == "distill_dinov2":  # its frozen teacher: a DINOv2 run folder (backbone + heads)
        from ssl_helpers import STUDENT_HEADS, dinov2_teacher_run

        method_extra = {**method_extra, **STUDENT_HEADS, "teacher": {"weights": str(dinov2_teacher_run(tmp_path))}}
    # the smallest ViT: dynamo traces each block's ops, and what is checked is the step's control flow, not its depth
    cfg = tiny_config(method, method_extra, augment=augment, output_dir=str(tmp_path), name="run", model=NANO,
                      trainer={"compile": True, "compile_backend": "eager", "max_epochs": 2,
                               "limit_train_batches": 2 * trainer.get("accumulate_grad_batches", 1),
                               "log_every_n_steps": 1, **trainer})
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        model, fitted = fit(cfg, tmp_path / "run")
    assert fitted.global_step == 4 and "forward_views" in vars(model)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.spawn
def test_a_compiled_run_resumes_bit_for_bit(compiled_checks):
    """MoCo v3 under trainer.compile, 4 steps straight against 2 steps, a checkpoint and 2 resumed steps in a fresh
    compile (as a new process makes): the same weights and momentum encoder, bit for bit (backend eager; AOTAutograd's
    graphs against eager: test_mfu.py's test_trainer_compile_trains_a_few_steps_on_cpu). In the interpreter of the
    one-graph checks (``compiled_checks``)."""
    resume = compiled_checks[1]["check_compiled_resume"]
    assert resume is None, resume


def check_compiled_resume(tmp: str) -> None:
    tmp_path = Path(tmp)

    def cfg(name):
        return tiny_config("moco_v3", output_dir=str(tmp_path), name=name, model=NANO,
                           trainer={"compile": True, "compile_backend": "eager", "max_epochs": 2,
                                    "limit_train_batches": 2, "log_every_n_steps": 1})

    torch._dynamo.reset()
    straight, _ = fit(cfg("a"), tmp_path / "a")
    torch._dynamo.reset()
    fit(cfg("b"), tmp_path / "b", callbacks=[StopAfterEpoch()])
    torch._dynamo.reset()
    resumed, trainer = fit(cfg("b"), tmp_path / "b", ckpt_path=str(tmp_path / "b" / "checkpoints" / "last.ckpt"))
    assert trainer.global_step == 4
    a, b = straight.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_every_whole_step_method_has_a_case():
    """A method added to the registry whose step compiles whole (``step_forward``) is checked above, or this fails."""
    from selfsup.methods import METHODS

    whole = {name for name, cls in METHODS.items() if getattr(cls, "step_forward", None)}
    assert whole == set(CASES) - set(VARIANTS), whole ^ (set(CASES) - set(VARIANTS))
    assert set(VARIANTS.values()) <= whole
