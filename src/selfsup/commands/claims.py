"""``selfsup claims list | run ID... | run --all [--resume] | table | rejudge``: the seeds' claims as commands with
a verdict.

The committed results ship with the package (``selfsup/claims/results/ID.json`` and ``ID.png``, read through
``importlib.resources``), so ``list`` and ``table`` show the last verdicts from any folder. ``run`` writes
``DIR/ID.json``, ``DIR/ID.png`` only under ``--out DIR`` and prints one verdict line; ``table`` prints
``docs/CLAIMS.md`` or writes it only where ``--write`` says; ``rejudge`` recomputes the verdicts of stored results
under the current rules from their per-seed metrics, without training.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from selfsup.claims.notes import AFTER_RUN
from selfsup.errors import UserError

if TYPE_CHECKING:
    from selfsup.claims.suite import Claim, Pilot

# claims.suite.PILOT_FIRST_SEED (tests/test_claims.py checks they agree), here so that the parser, built for every
# `selfsup` command, imports no claim module: they train and evaluate (the engine, Lightning; scipy) and are imported
# by the claims commands when they run
PILOT_FIRST_SEED = 1000

RESULTS = Path(str(resources.files("selfsup.claims").joinpath("results")))  # the committed results
REPO_RESULTS = "src/selfsup/claims/results"  # the same folder, as a checkout names it


def _last(results: Path, claim_id: str) -> dict | None:
    path = Path(results) / f"{claim_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _verdict(last: dict | None) -> str:
    return f"{last['verdict']}{' (quick)' if last['quick'] else ''}" if last else "not run yet"


def source(c: Claim) -> str:
    from selfsup.claims.registry import PAPERS

    return f"{PAPERS[c.seed]} ({'seed ' if c.seed[:3].isdigit() else ''}{c.seed})"


def cmd_list(args) -> int:
    from selfsup.claims.registry import CLAIMS

    for c in CLAIMS.values():
        last = _last(Path(args.results), c.id)
        print(f"{c.id}  [{source(c)}, {c.section}]  last: {_verdict(last)}\n    {c.statement}\n"
              f"    paper: {c.paper}\n    rule: {' and '.join(map(str, c.rules))}\n    budget: {c.why_different}\n"
              f"    pilot: {c.pilot if c.pilot else 'none ran'}")
    return 0


def _matches(last: dict | None, claim: Claim, quick: bool, seeds: int) -> bool:
    """A stored result of this claim's current definition and code, at the same budget and seeds."""
    from selfsup.claims.suite import definition_hash

    return bool(last) and last.get("code_hash") == definition_hash(claim) and last["quick"] == quick \
        and last["seeds"] == seeds  # the first seed too: definition_hash covers every field of the claim


def _expected_s(claim: Claim, quick: bool, seeds: int, out: Path) -> float | None:
    """The wall time of the claim's last result at this budget (quick or not, and the budget its definition states
    now), scaled to ``seeds``; None where there is none."""
    for folder in (out, RESULTS):
        last = _last(folder, claim.id)
        if last and last["quick"] == quick and last.get("wall_s") and not redefined(claim, last):
            return last["wall_s"] * seeds / max(last["seeds"], 1)
    return None


def _commit() -> str | None:
    """The checkout's commit the claim ran at, ``+dirty`` where the package's sources differed from it; None outside
    a git checkout."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(here.parent)], cwd=here,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    changed = [line for line in dirty.stdout.splitlines() if not line[3:].startswith(REPO_RESULTS)]
    return head.stdout.strip() + ("+dirty" if changed else "")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def check_known(ids) -> None:
    """One line naming the first id that is no claim."""
    from selfsup.claims.registry import CLAIMS

    for claim_id in ids:
        if claim_id not in CLAIMS:
            raise UserError(f"claim {claim_id!r} is not known; `selfsup claims list` names them")


def cmd_run(args) -> int:
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import Context, plot_result, run_claim

    if not args.out:
        raise UserError(f"claims run writes DIR/ID.json and DIR/ID.png: give --out DIR (the committed results are "
                        f"{REPO_RESULTS} in a checkout)")
    if args.all == bool(args.ids):
        raise UserError("claims run takes claim ids or --all, not both or neither; `selfsup claims list` names them")
    check_known(args.ids)
    if args.seeds < 0:
        raise UserError(f"--seeds {args.seeds} must be >= 1 (or 0: each claim's own)")
    claims = list(CLAIMS.values()) if args.all else [CLAIMS[i] for i in args.ids]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

    commit = _commit()  # the code this process runs
    plan = []
    for claim in claims:
        seeds = args.seeds or claim.default_seeds
        if args.resume:
            kept = next((f for f in (out, RESULTS) if _matches(_last(f, claim.id), claim, args.quick, seeds)), None)
            if kept is not None:
                if Path(kept).resolve() != out.resolve():
                    for ext in ("json", "png"):
                        if (Path(kept) / f"{claim.id}.{ext}").exists():
                            shutil.copy(Path(kept) / f"{claim.id}.{ext}", out / f"{claim.id}.{ext}")
                print(f"{claim.id}: skipped, its result in {kept} matches the definition and code "
                      f"({_verdict(_last(kept, claim.id))})")
                continue
        plan.append((claim, seeds, _expected_s(claim, args.quick, seeds, out)))
    for i, (claim, seeds, _) in enumerate(plan):
        left = [e for _, _, e in plan[i:]]
        known = [e for e in left if e is not None]
        unknown = len(left) - len(known)
        progress(f"claim {i + 1}/{len(plan)}: {claim.id} ({seeds} seed(s)); expected remaining "
                 f"{_minutes(sum(known))}" + (f" + {unknown} claim(s) with no previous time" if unknown else ""))
        claim_start = time.perf_counter()
        work = Path(args.work) / claim.id
        result = run_claim(claim, Context(quick=args.quick, seeds=seeds, work=work, overrides=args.set,
                                          progress=progress, first_seed=claim.first_seed))
        result["wall_s"] = round(time.perf_counter() - claim_start, 1)
        result["commit"] = commit
        (out / f"{claim.id}.json").write_text(json.dumps(result, indent=1))
        plot_result(result, out / f"{claim.id}.png")
        print(f"{claim.id}: {_verdict(result)} — ours: {result['ours']}; paper: {claim.paper}", flush=True)
    return 0


# ---- pilots -----------------------------------------------------------------------------------------------------

def pilot_figures(claim: Claim, result: dict, wall_s: float) -> Pilot:
    """The ``Pilot`` of a pilot's result: its seeds, the most optimiser steps of one of its runs, its wall time and
    the per-seed sd of each rule's metric."""
    from selfsup.claims import stats  # scipy
    from selfsup.claims.suite import Pilot

    sds = []
    for metric in dict.fromkeys(r.metric for r in claim.rules):
        values = result["metrics"].get(metric, [])
        if len(values) > 1 and all(isinstance(v, (int, float)) and v == v for v in values):
            sds.append((metric, round(stats.summary(values)[2], 4)))
    steps = max((r["steps"] or 0 for r in result["runs"]), default=0)
    return Pilot(seeds=result["seeds"], steps=steps, wall_s=round(wall_s, 1), sd=tuple(sds))


def cmd_pilot(args) -> int:
    from selfsup.claims import planning  # scipy
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import Context, MIN_SEEDS, run_claim

    if not args.out:
        raise UserError("claims pilot writes DIR/ID.pilot.json: give --out DIR")
    check_known(args.ids)
    if args.seeds < 2:
        raise UserError(f"--seeds {args.seeds}: a pilot needs at least 2 seeds to measure a spread")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

    for claim_id in args.ids:
        claim, claim_start = CLAIMS[claim_id], time.perf_counter()
        work = Path(args.work) / f"{claim_id}-pilot"
        result = run_claim(claim, Context(quick=args.quick, seeds=args.seeds, work=work, overrides=args.set,
                                          progress=progress, first_seed=PILOT_FIRST_SEED))
        pilot = pilot_figures(claim, result, time.perf_counter() - claim_start)
        upper = {m: planning.sd_upper(sd, pilot.seeds) for m, sd in pilot.sd}
        planned = {m: planning.planned_mde(sd, pilot.seeds, MIN_SEEDS) for m, sd in pilot.sd}
        result.update(pilot=str(pilot), pilot_figures={"seeds": pilot.seeds, "steps": pilot.steps,
                                                       "wall_s": pilot.wall_s, "sd": dict(pilot.sd),
                                                       "mde_at_3_seeds": pilot.mde(), "sd_upper": upper,
                                                       "sd_upper_level": planning.UPPER_LEVEL,
                                                       "mde_at_3_seeds_at_sd_upper": planned})
        (out / f"{claim_id}.pilot.json").write_text(json.dumps(result, indent=1))
        caution = "; ".join(f"{m}: sd ≤ {upper[m]:.3g} → MDE at {MIN_SEEDS} seeds {planned[m]:.3g}" for m in upper)
        print(f"{claim_id}: pilot {pilot}\n    at the sd's {planning.UPPER_LEVEL:.0%} upper bound "
              f"({pilot.seeds} pilot seeds): {caution or 'no spread measured'}\n    pilot={pilot!r}", flush=True)
    return 0


# ---- re-judging stored results --------------------------------------------------------------------------------

PM = re.compile(r"(?<![\d.])([+-]?)(\d+\.\d+) ± (\d+\.\d+)")


def intervals_for_pm(text: str, metrics: dict[str, list[float]], seeds: int) -> str:
    """Each ``mean ± sd`` of an older result's text as ``mean [lo, hi]`` (the 95% interval), from the metric
    whose per-seed values give that mean and sd (a sign the old text dropped is restored from the values); from
    the printed mean and sd over ``seeds`` where no metric matches."""
    from selfsup.claims import stats  # scipy
    from selfsup.claims.suite import mean_ci

    def replace(match: re.Match) -> str:
        sign, mean, sd = match.group(1), float(match.group(2)), float(match.group(3))
        signed = -mean if sign == "-" else mean
        for values in metrics.values():
            if len(values) < 2 or not all(isinstance(v, (int, float)) for v in values):
                continue
            n, m, s = stats.summary(values)
            if abs(round(s, 2) - sd) < 6e-3 and (abs(round(m, 2) - signed) < 6e-3 or
                                                 not sign and abs(round(abs(m), 2) - mean) < 6e-3):
                return mean_ci(values, sign=bool(sign))
        if seeds < 2:
            return match.group(0)
        lo, hi = stats.interval(signed, sd, seeds)
        f = "{:+.2f}" if sign else "{:.2f}"
        return f"{f.format(signed)} [{f.format(lo)}, {f.format(hi)}]"

    return PM.sub(replace, text)


def rejudge(result: dict) -> dict:
    """``result`` with its verdict and per-rule statistics recomputed under the claim's current rules."""
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import TEST_IMAGES, binomial_sd, judge_result

    claim = CLAIMS[result["id"]]
    verdict, judged = judge_result(claim, result["metrics"])
    # the accuracies keep the test split they were measured on (a claim may have moved to another since): the
    # stored figure, else the digits' (every result before the per-rule statistics scored on digits)
    before = {s["rule"]: s.get("test_images") for s in result.get("statistics", [])}
    for s in judged:
        if "test_images" in s:
            images = before.get(s["rule"]) or (TEST_IMAGES["digits"] if "statistics" not in result else None)
            if images and images != s["test_images"]:
                s["test_images"] = images
                s["binomial_sd"] = {arm: binomial_sd(statistics.fmean(result["metrics"][arm]), images)
                                    for arm in s["binomial_sd"]}
    if "statistics" not in result:  # its text is from the mean ± sd days
        result["ours"] = intervals_for_pm(result["ours"], result["metrics"], result["seeds"])
        result["rejudged"] = ("measured by an earlier definition of the claim; verdict and statistics recomputed "
                              "from its per-seed metrics under the current rules, without training")
    result.update(rules=[str(r) for r in claim.rules], verdict=verdict, statistics=judged)
    return result


def cmd_rejudge(args) -> int:
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import plot_result

    folder = Path(args.results)
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise UserError(f"--results {folder} holds no claim result JSONs")
    for path in paths:
        result = json.loads(path.read_text())
        if result.get("id") not in CLAIMS:
            print(f"{path.name}: not a known claim, left alone", file=sys.stderr)
            continue
        before = _verdict(result)
        result = rejudge(result)
        path.write_text(json.dumps(result, indent=1))
        plot_result(result, path.with_suffix(".png"))
        print(f"{result['id']}: {before} → {_verdict(result)}")
    return 0


# ---- docs/CLAIMS.md ---------------------------------------------------------------------------------------------

def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def rule_cell(s: dict) -> str:
    """One rule's figures: mean, 95% interval, n, MDE, and the binomial sd of its accuracies."""
    if s["mean"] is None:
        text = f"`{s['rule']}`: {s['why']}"
    elif s["interval"] is None:
        text = f"`{s['rule']}`: {s['mean']:.3g} (n {s['n']}{', deterministic' if not s['why'] else ''})"
    else:
        lo, hi = s["interval"]
        text = f"`{s['rule']}`: {s['mean']:+.3g} [{lo:+.3g}, {hi:+.3g}], n {s['n']}, MDE {_num(s['mde'])}"
    if s.get("pairs"):  # a correlation rule: n runs, its pairs, the bootstrap behind the interval
        text += f"; {s['pairs']} (run, checkpoint) pairs, {s['interval_kind']}"
    if s.get("binomial_sd"):
        sds = ", ".join(f"{arm} {_num(v)}" for arm, v in s["binomial_sd"].items())
        text += f"; binomial sd of each accuracy ({s['test_images']} test images): {sds} points"
    return text


def paragraph(c: Claim, last: dict) -> str:
    """What was tried, the interval, and the scale that would decide it; from the definition and the result."""
    from selfsup.claims.suite import INCONCLUSIVE, NOT_REPRODUCED

    lines = [f"**`{c.id}`** — {_verdict(last)}. Tried: {last.get('why_different') or c.why_different}; "
             f"{last['seeds']} seed(s)."]
    for s in last["statistics"]:
        if s["verdict"] == INCONCLUSIVE or s["verdict"] == NOT_REPRODUCED:
            where = (f"mean {s['mean']:+.3g}, 95% interval [{s['interval'][0]:+.3g}, {s['interval'][1]:+.3g}]"
                     if s["interval"] else f"value {s['mean']:.3g}" if s["mean"] is not None else "")
            lines.append(f"`{s['rule']}` {s['verdict']}" + (f": {where}" if where else "")
                         + (f" ({s['why']})" if s["why"] else "") + ".")
    needed = [s["seeds_needed"] for s in last["statistics"] if s["verdict"] == INCONCLUSIVE and s["seeds_needed"]]
    if needed:
        lines.append(f"Seeds needed at the measured spread (to detect the paper's effect, or the observed one where "
                     f"the paper states none in these units): up to {max(needed)}.")
    if AFTER_RUN.get(c.id) or c.decide:
        lines.append(AFTER_RUN.get(c.id) or c.decide)
    if redefined(c, last):
        lines.append(f"Redefined since, not re-run yet: {c.why_different}.")
    return " ".join(lines)


def redefined(c: Claim, last: dict) -> bool:
    """The stored result was measured at another budget than the claim's current definition states."""
    return bool(last.get("why_different")) and last["why_different"] != c.why_different


def budget_cell(c: Claim, last: dict | None) -> str:
    """The budget the stored result was measured at, the current one where the claim was redefined since, and the
    pilot that set the current one."""
    if not last:
        text = c.why_different
    elif redefined(c, last):
        text = f"{last['why_different']}. **Redefined, not re-run yet:** {c.why_different}"
    else:
        text = last.get("why_different") or c.why_different
    return text + (f". Pilot: {c.pilot}" if c.pilot else "")


def table(results: Path) -> str:
    """docs/CLAIMS.md: every claim with the paper's figure, ours, the statistics, the command and the verdict."""
    from selfsup.claims.registry import CLAIMS, PAPERS, short

    lines = ["# The seeds' claims", "",
             f"Generated by `selfsup claims table --write docs/CLAIMS.md` (`selfsup.commands.claims`) from "
             f"`{REPO_RESULTS}/*.json` (shipped with the package) and, for a claim not reproduced, the note of "
             "`selfsup.claims.notes`; do not edit by hand.",
             "Each verdict follows the rules stated in the claim's definition (`src/selfsup/claims/<seed module>.py`) "
             "before the run. Per rule: the mean of the per-seed (paired) values, its 95% confidence interval "
             "(Student t, n − 1 dof) and the minimum detectable effect (MDE) at 80% power for that n and spread. A "
             "rule holds when the whole interval lies on the claimed side, fails when it lies wholly on the other, "
             "and is *inconclusive* otherwise; a training claim with fewer than 3 seeds is inconclusive. Only the "
             "simulators are judged on one run. *(quick)* marks a verdict of the quick budget. Each JSON stores "
             "`code_hash` (`definition_hash`: the claim's definition, the source of its seed module, of `suite.py`, "
             "`stats.py` and the modules it imports, and the presets it names); `claims run --all --resume` skips a "
             "claim whose hash still matches. Each kNN accuracy comes with its binomial sd, "
             "100·√(p(1 − p)/N) points for N test images: 359 on digits (about 2.4 points near 70%), 10,000 on "
             "Fashion-MNIST (about 0.45); a claim whose effect is a few points scores on Fashion-MNIST. A claim's "
             "budget was set from a short pilot on other seeds (`selfsup claims pilot`) where its row names one. A "
             "correlation claim (`lejepa-loss-tracks-accuracy`) has one Spearman ρ per seed, over that seed's "
             "(run, checkpoint) pairs, judged as any per-seed metric.", "",
             "| claim | source | statement | paper | ours | rules: mean [95% interval], n, MDE | verdict | command | "
             "budget, and why it may differ |",
             "|---|---|---|---|---|---|---|---|---|"]
    open_ = []
    for c in CLAIMS.values():
        last = _last(results, c.id)
        ours = last["ours"] if last else "—"
        verdict = (f"**{last['verdict']}**" + (" (quick)" if last["quick"] else "")) if last else "not run yet"
        rules = "<br>".join(rule_cell(s) for s in last["statistics"]) if last and "statistics" in last else "—"
        lines.append(f"| `{c.id}` | {PAPERS[c.seed]} ({short(c.seed)}), {c.section} | {c.statement} | {c.paper} | "
                     f"{ours} | {rules} | {verdict} | `selfsup claims run {c.id} --out {REPO_RESULTS}` | "
                     f"{budget_cell(c, last)} |")
        if last and "statistics" in last and last["verdict"] != "reproduced":
            open_.append(paragraph(c, last))
        elif not last:
            open_.append(f"**`{c.id}`** — not run yet. Budget: {c.why_different}. {c.decide}".rstrip())
    lines += ["", f"Tally: {tally_text(results)}.", ""]
    if open_:
        lines += ["## Not reproduced or inconclusive: what was tried, and what would decide it", "",
                  *[p + "\n" for p in open_]]
    return "\n".join(lines).rstrip("\n") + "\n"


def cmd_table(args) -> int:
    text = table(Path(args.results))
    if not args.write:
        sys.stdout.write(text)
        return 0
    path = Path(args.write)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def tally_text(results: Path = RESULTS) -> str:
    """``N claims: a reproduced, b not reproduced, c inconclusive`` (quick verdicts counted apart)."""
    from selfsup.claims.registry import CLAIMS

    counts: dict[str, int] = {}
    for c in CLAIMS.values():
        key = _verdict(_last(results, c.id))
        counts[key] = counts.get(key, 0) + 1
    order = ["reproduced", "not reproduced", "inconclusive"]
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    return f"{len(CLAIMS)} claims: " + ", ".join(f"{counts[k]} {k}" for k in keys)


def add_claims_parser(p) -> None:
    """``selfsup claims list | run | table | pilot | rejudge``: ``p`` is its parser, made by ``commands.main``."""
    names = p.add_subparsers(dest="claims_command", metavar="COMMAND", required=True)
    ls = names.add_parser("list", help="every claim with its source, statement, paper figure and last verdict")
    ls.add_argument("--results", default=str(RESULTS), help="folder of result JSONs (default: the committed ones)")
    ls.set_defaults(func=cmd_list)
    run = names.add_parser("run", help="run claims: JSON, PNG and a one-line verdict each")
    run.add_argument("ids", nargs="*", metavar="ID", help="claim ids (selfsup claims list)")
    run.add_argument("--all", action="store_true", help="every claim, in the registry's order")
    run.add_argument("--resume", action="store_true",
                     help="skip claims whose result in --out or the committed one matches the current definition "
                          "and code (its code_hash), budget and seeds")
    run.add_argument("--quick", action="store_true", help="a few CPU-minutes instead of the full budget")
    run.add_argument("--seeds", type=int, default=0, help="training seeds (default: each claim's own)")
    run.add_argument("--out", default="", metavar="DIR", help=f"output folder (the committed one: {REPO_RESULTS})")
    run.add_argument("--work", default="runs/claims", metavar="DIR",
                     help="folder for the claims' training runs (default runs/claims; ID/ inside it)")
    run.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for every run")
    run.set_defaults(func=cmd_run)
    tb = names.add_parser("table", help="docs/CLAIMS.md from the result JSONs: printed, or written with --write")
    tb.add_argument("--results", default=str(RESULTS), help="folder of result JSONs (default: the committed ones)")
    tb.add_argument("--write", default="", metavar="PATH", help="write the table to PATH (docs/CLAIMS.md)")
    tb.set_defaults(func=cmd_table)
    pl = names.add_parser("pilot", help="a short pilot of claims on other seeds: the figures that set a budget")
    pl.add_argument("ids", nargs="+", metavar="ID", help="claim ids (selfsup claims list); one process shares runs")
    pl.add_argument("--seeds", type=int, default=3,
                    help=f"pilot seeds, from {PILOT_FIRST_SEED} (default 3: two understate the spread up to ×4, "
                         "see claims/planning.py)")
    pl.add_argument("--out", default="", metavar="DIR", help="folder for ID.pilot.json")
    pl.add_argument("--quick", action="store_true", help="the pilot of the quick budget (for tests)")
    pl.add_argument("--work", default="runs/claims", metavar="DIR", help="folder for the pilots' runs (ID-pilot/)")
    pl.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for every run")
    pl.set_defaults(func=cmd_pilot)
    rj = names.add_parser("rejudge", help="recompute the verdicts of stored results under the current rules")
    rj.add_argument("--results", required=True, metavar="DIR", help=f"folder of result JSONs ({REPO_RESULTS})")
    rj.set_defaults(func=cmd_rejudge)

