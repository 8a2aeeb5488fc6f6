"""benchmarks/floor_curves.py: the floor sweep's variants of one preset, side by side."""

import json


def load():
    import benchmarks.floor_curves

    return benchmarks.floor_curves


def variant(name, preset="wmse-vit-fmnist", epochs=5, seed=100, gain=None, **series):
    return {"name": name, "preset": preset, "overrides": [], "epochs": epochs, "seed": seed, "gain_val": gain,
            "stopped_at_step": None if gain is not None else 20, **series}


def test_it_keeps_one_preset_at_one_budget_and_tables_the_last_value_of_each_sign(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"variants": [
        variant("W0", gain=4.55, eff_rank_embedding=[[0, 47.0], [20, 14.0]], loss=[[9, 1.8], [19, 1.5]]),
        variant("W9", eff_rank_embedding=[[0, 47.0], [20, 7.0]]),
        variant("S0", preset="swav-fmnist", gain=1.0),  # another preset: left out
        variant("W0", epochs=10, gain=3.38)]}))  # another budget: left out
    png = tmp_path / "curves.png"
    assert load().main(["--preset", "wmse-vit-fmnist", "--files", str(a), "--signs", "eff_rank_embedding,loss",
                        "--out", str(png)]) == 0
    table = png.with_suffix(".md").read_text().splitlines()
    assert len(table) == 4 and png.stat().st_size > 0
    assert table[2] == "| W0 | (preset) | +4.55 | 14 @ 20 | 1.5 @ 19 |"
    assert table[3] == "| W9 | (preset) | stopped | 7 @ 20 | – |"
    assert "W9 (stopped at step 20)" == load().label(variant("W9"))


def test_no_variant_of_the_preset_is_one_line_and_exit_2(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"variants": [variant("S0", preset="swav-fmnist", gain=1.0)]}))
    assert load().main(["--preset", "wmse-vit-fmnist", "--files", str(a), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no wmse-vit-fmnist variant") and "\n" not in err
