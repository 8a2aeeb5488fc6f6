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
import sys
import time
from importlib import resources
from pathlib import Path

from selfsup.claims import stats
from selfsup.claims.registry import CLAIMS, PAPERS
from selfsup.claims.suite import (INCONCLUSIVE, NOT_REPRODUCED, Claim, Context, definition_hash, judge_result,
                                  mean_ci, plot_result, run_claim)
from selfsup.errors import UserError

RESULTS = Path(str(resources.files("selfsup.claims").joinpath("results")))  # the committed results
REPO_RESULTS = "src/selfsup/claims/results"  # the same folder, as a checkout names it


def _last(results: Path, claim_id: str) -> dict | None:
    path = Path(results) / f"{claim_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _verdict(last: dict | None) -> str:
    return f"{last['verdict']}{' (quick)' if last['quick'] else ''}" if last else "not run yet"


def source(c: Claim) -> str:
    return f"{PAPERS[c.seed]} (seed {c.seed})"


def cmd_list(args) -> int:
    for c in CLAIMS.values():
        last = _last(Path(args.results), c.id)
        print(f"{c.id}  [{source(c)}, {c.section}]  last: {_verdict(last)}\n    {c.statement}\n"
              f"    paper: {c.paper}\n    rule: {' and '.join(map(str, c.rules))}")
    return 0


def _matches(last: dict | None, claim: Claim, quick: bool, seeds: int) -> bool:
    """A stored result of this claim's current definition and code, at the same budget and seeds."""
    return bool(last) and last.get("code_hash") == definition_hash(claim) and last["quick"] == quick \
        and last["seeds"] == seeds


def _expected_s(claim: Claim, quick: bool, seeds: int, out: Path) -> float | None:
    """The wall time of the claim's last result at this budget, scaled to ``seeds``; None where there is none."""
    for folder in (out, RESULTS):
        last = _last(folder, claim.id)
        if last and last["quick"] == quick and last.get("wall_s"):
            return last["wall_s"] * seeds / max(last["seeds"], 1)
    return None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def cmd_run(args) -> int:
    if not args.out:
        raise UserError(f"claims run writes DIR/ID.json and DIR/ID.png: give --out DIR (the committed results are "
                        f"{REPO_RESULTS} in a checkout)")
    if args.all == bool(args.ids):
        raise UserError("claims run takes claim ids or --all, not both or neither; `selfsup claims list` names them")
    for claim_id in args.ids:
        if claim_id not in CLAIMS:
            raise UserError(f"claim {claim_id!r} is not known; `selfsup claims list` names them")
    if args.seeds < 0:
        raise UserError(f"--seeds {args.seeds} must be >= 1 (or 0: each claim's own)")
    claims = list(CLAIMS.values()) if args.all else [CLAIMS[i] for i in args.ids]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

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
                                          progress=progress))
        result["wall_s"] = round(time.perf_counter() - claim_start, 1)
        (out / f"{claim.id}.json").write_text(json.dumps(result, indent=1))
        plot_result(result, out / f"{claim.id}.png")
        print(f"{claim.id}: {_verdict(result)} — ours: {result['ours']}; paper: {claim.paper}", flush=True)
    return 0


# ---- re-judging stored results --------------------------------------------------------------------------------

PM = re.compile(r"(?<![\d.])([+-]?)(\d+\.\d+) ± (\d+\.\d+)")


def intervals_for_pm(text: str, metrics: dict[str, list[float]], seeds: int) -> str:
    """Each ``mean ± sd`` of an older result's text as ``mean [lo, hi]`` (the 95% interval), from the metric
    whose per-seed values give that mean and sd (a sign the old text dropped is restored from the values); from
    the printed mean and sd over ``seeds`` where no metric matches."""
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
    claim = CLAIMS[result["id"]]
    verdict, judged = judge_result(claim, result["metrics"])
    if "statistics" not in result:  # its text is from the mean ± sd days
        result["ours"] = intervals_for_pm(result["ours"], result["metrics"], result["seeds"])
        result["rejudged"] = ("measured by an earlier definition of the claim; verdict and statistics recomputed "
                              "from its per-seed metrics under the current rules, without training")
    result.update(rules=[str(r) for r in claim.rules], verdict=verdict, statistics=judged)
    return result


def cmd_rejudge(args) -> int:
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
    if s.get("binomial_sd"):
        sds = ", ".join(f"{arm} {_num(v)}" for arm, v in s["binomial_sd"].items())
        text += f"; binomial sd of each accuracy ({s['test_images']} test images): {sds} points"
    return text


def paragraph(c: Claim, last: dict) -> str:
    """What was tried, the interval, and the scale that would decide it; from the definition and the result."""
    lines = [f"**`{c.id}`** — {_verdict(last)}. Tried: {c.why_different}; {last['seeds']} seed(s)."]
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
    if c.decide:
        lines.append(c.decide)
    return " ".join(lines)


def table(results: Path) -> str:
    """docs/CLAIMS.md: every claim with the paper's figure, ours, the statistics, the command and the verdict."""
    lines = ["# The seeds' claims", "",
             f"Generated by `selfsup claims table --write docs/CLAIMS.md` from `{REPO_RESULTS}/*.json` (shipped "
             "with the package); do not edit by hand.",
             "Each verdict follows the rules stated in the claim's definition (`src/selfsup/claims/<seed module>.py`) "
             "before the run. Per rule: the mean of the per-seed (paired) values, its 95% confidence interval "
             "(Student t, n − 1 dof) and the minimum detectable effect (MDE) at 80% power for that n and spread. A "
             "rule holds when the whole interval lies on the claimed side, fails when it lies wholly on the other, "
             "and is *inconclusive* otherwise; a training claim with fewer than 3 seeds is inconclusive. Only the "
             "simulators are judged on one run. *(quick)* marks a verdict of the quick budget. Each JSON stores "
             "`code_hash` (`definition_hash`: the claim's definition, the source of its seed module, of `suite.py`, "
             "`stats.py` and the modules it imports, and the presets it names); `claims run --all --resume` skips a "
             "claim whose hash still matches.", "",
             "| claim | source | statement | paper | ours | rules: mean [95% interval], n, MDE | verdict | command | "
             "why it may differ |",
             "|---|---|---|---|---|---|---|---|---|"]
    open_ = []
    for c in CLAIMS.values():
        last = _last(results, c.id)
        ours = last["ours"] if last else "—"
        verdict = (f"**{last['verdict']}**" + (" (quick)" if last["quick"] else "")) if last else "not run yet"
        rules = "<br>".join(rule_cell(s) for s in last["statistics"]) if last and "statistics" in last else "—"
        lines.append(f"| `{c.id}` | {PAPERS[c.seed]} ({c.seed[:3]}), {c.section} | {c.statement} | {c.paper} | "
                     f"{ours} | {rules} | {verdict} | `selfsup claims run {c.id} --out {REPO_RESULTS}` | "
                     f"{c.why_different} |")
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
    counts: dict[str, int] = {}
    for c in CLAIMS.values():
        key = _verdict(_last(results, c.id))
        counts[key] = counts.get(key, 0) + 1
    order = ["reproduced", "not reproduced", "inconclusive"]
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    return f"{len(CLAIMS)} claims: " + ", ".join(f"{counts[k]} {k}" for k in keys)


def add_claims_parser(sub) -> None:
    p = sub.add_parser("claims", help="the seeds' claims: list, run with a verdict, re-judge, or write docs/CLAIMS.md")
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
    rj = names.add_parser("rejudge", help="recompute the verdicts of stored results under the current rules")
    rj.add_argument("--results", required=True, metavar="DIR", help=f"folder of result JSONs ({REPO_RESULTS})")
    rj.set_defaults(func=cmd_rejudge)

