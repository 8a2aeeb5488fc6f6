"""Each ``*-fmnist`` preset trains the budget its row of the README's table measured (issue 49): resolving the
preset as shipped gives the same training config as the one ``benchmarks/methods_fmnist.py`` trained, so a user's
``selfsup pretrain <preset>`` reproduces the figure the table quotes."""

import json
from pathlib import Path

import pytest

from selfsup.config import flatten, load_run_config, to_dict

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# which table row a preset's budget answers to: the 10-epoch table for the one preset that trains 10 epochs
ROWS = {name: json.loads((RESULTS / name).read_text())
        for name in ("methods_fmnist_5ep.json", "methods_fmnist_10ep.json")}
MEASURED = sorted({(row["preset"], name) for name, table in ROWS.items() for row in table["runs"]})


def measured_config(preset: str, table: dict, extra: list[str]):
    """The config ``methods_fmnist.py`` trained: its budget's epochs, a warm-up of 10% of them, its batch."""
    budget = table["budget"]
    assert budget["steps_per_epoch"] == 0 and budget["warmup"] == "10% of the run"
    return load_run_config(preset, [f"trainer.max_epochs={budget['epochs']}",
                                    f"optim.warmup_epochs={budget['epochs'] / 10:g}",
                                    f"data.batch_size={budget['batch_size']}", *extra])


def test_every_fmnist_preset_of_the_table_is_checked():
    five = {p for p, name in MEASURED if name == "methods_fmnist_5ep.json"}
    assert {"simclr-fmnist", "dino-fmnist", "mae-fmnist", "wmse-vit-fmnist", "wmse-fmnist"} <= five
    assert len(five) >= 14


@pytest.mark.parametrize("preset,table", MEASURED)
def test_preset_trains_the_budget_its_table_row_measured(preset, table):
    shipped = flatten(to_dict(load_run_config(preset, [])))
    if shipped["trainer.max_epochs"] != ROWS[table]["budget"]["epochs"]:
        # a preset measured at two budgets answers to the one it trains (wmse-fmnist: its 10 epochs)
        others = [t for t in ROWS if t != table and (preset, t) in MEASURED]
        assert any(ROWS[t]["budget"]["epochs"] == shipped["trainer.max_epochs"] for t in others), \
            f"{preset} trains {shipped['trainer.max_epochs']} epochs, a budget no table measured"
        return
    extra = next(r["overrides"] for r in ROWS[table]["runs"] if r["preset"] == preset)
    trained = flatten(to_dict(measured_config(preset, ROWS[table], extra)))
    differ = {k: (shipped[k], trained[k]) for k in shipped if shipped[k] != trained[k]}
    assert not differ, f"{preset}: the shipped preset differs from its table row's config (shipped, trained): {differ}"
