"""The rules of a resume (``selfsup pretrain --resume RUN``, ``selfsup.pretrain(resume=RUN)``): the run's own config,
of which only how long it trains and when it writes checkpoints may change (``resume_config``), and what the resume
does, from the run's facts (``resume_action``): train on, finish a run whose training is done but whose finishing
(export, report) was cut short, or nothing. ``resume`` takes both decisions, once, for the engine."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from selfsup.config import (RunConfig, flatten, load_run_config, merge, parse_overrides, read_run_config, resolve,
                            to_dict)
from selfsup.diskspace import write_text
from selfsup.errors import UserError
from selfsup.runs.facts import read_run_facts

# what --resume may change: how long the run trains (extending it) and when it writes checkpoints
RESUME_MAY_CHANGE = ("trainer.max_epochs", "trainer.max_steps", "trainer.progress_bar",
                     "trainer.checkpoint_every_n_steps", "trainer.checkpoint_every_n_minutes")


def resume_config(run: Path, preset: str | None, items: list[str]) -> tuple[RunConfig, dict]:
    """The config a resume continues with: the run's own config.yaml, with only ``RESUME_MAY_CHANGE`` keys
    overridden; a preset or an override that contradicts the run is refused in one line. Also the changed keys:
    ``{key: (the run's value, the new one)}``."""
    raw = read_run_config(run)
    current = flatten(to_dict(resolve(raw)))
    if preset is not None:
        given = flatten(to_dict(load_run_config(preset, items)))
        for key, value in given.items():
            if key not in RESUME_MAY_CHANGE and key not in ("output_dir", "name") and current.get(key) != value:
                raise UserError(f"--resume {run} continues the run's own config.yaml, and preset {preset} sets "
                                f"{key}={value} where the run has {current.get(key)}; drop the preset argument")
    cfg = resolve(merge(raw, parse_overrides(items)))
    for key, value in flatten(to_dict(cfg)).items():
        if key not in RESUME_MAY_CHANGE and current.get(key) != value:
            raise UserError(f"--resume {run} continues the run's own config.yaml: {key}={value} contradicts its "
                            f"{key}={current.get(key)}; drop it (only {', '.join(RESUME_MAY_CHANGE[:2])} extend a "
                            "run) or start a new run")
    return cfg, {k: (current.get(k), v) for k, v in flatten(to_dict(cfg)).items() if current.get(k) != v}


def extends(cfg: RunConfig, facts: dict) -> bool:
    """Whether ``cfg`` trains longer than the run's facts say it has."""
    t = cfg.trainer
    return t.max_steps > int(facts.get("global_step", 0)) if t.max_steps else t.max_epochs > int(facts.get("epochs", 0))


def resume_action(cfg: RunConfig, facts: dict) -> str:
    """What resuming a run with ``facts`` (run.json) under ``cfg`` does: ``train`` (its training is not done, or
    ``cfg`` extends it), ``finish`` (trained; its finishing steps, ``facts["finished_steps"]``, not all done) or
    ``done``. A run.json without status (an earlier version) was written only at the end of a run."""
    status = facts.get("status", "finished" if facts else None)
    if status not in ("trained", "finished") or extends(cfg, facts):
        return "train"
    return "finish" if status == "trained" else "done"


def nothing_to_train(run: Path, facts: dict) -> str:
    """The line a resume of a finished run prints."""
    return (f"{run} is finished ({facts.get('global_step')} steps, {facts.get('epochs')} epochs); nothing to train. "
            f"Extend it with: selfsup pretrain --resume {run} trainer.max_epochs=N (or trainer.max_steps=N)")


def write_resumed_config(run: Path, cfg: RunConfig) -> None:
    """The run's config.yaml with the keys a resume changed (rank 0 only: DDP children re-read it)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        write_text(Path(run) / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False), "the run's config")


def resume(run: Path, preset: str | None, items: list[str]) -> tuple[RunConfig, str]:
    """The config the run ``run`` continues with (``resume_config``; its changes written back unless nothing is left
    to do) and what the resume does (``resume_action``: ``train``, ``finish`` or ``done``)."""
    cfg, changed = resume_config(run, preset, items)
    action = resume_action(cfg, read_run_facts(run))
    if changed and action != "done":
        write_resumed_config(run, cfg)
    line = new_length_line(changed)
    if line and action == "train":
        print(line)
    return cfg, action


def new_length_line(changed: dict) -> str | None:
    """The line a resume prints where it changes the run's length (``trainer.max_epochs`` / ``max_steps``): the
    schedules (lr warm-up and cosine, weight decay, EMA momentum, teacher temperature) are functions of the run's
    length, so they continue on the new length's curves from the step the run stopped at: a jump, not the curve of
    either run. None where the length is unchanged."""
    keys = [k for k in ("trainer.max_epochs", "trainer.max_steps") if k in changed]
    if not keys:
        return None
    was = ", ".join(f"{k}={changed[k][0]}" for k in keys)
    now = ", ".join(f"{k}={changed[k][1]}" for k in keys)
    return (f"selfsup: the run's schedules (lr cosine, warm-up, momentum, temperatures) were made for {was}; resumed "
            f"with {now} they follow the new length's curves from here on (a jump where the curves differ; start a "
            "new run for a schedule made for the new length)")
