"""The decoupled per-mode dynamics of BYOL / SimSiam (Tian, Chen & Ganguli 2021, seed 003, Eqns. 11-13).

For one eigenmode: p = the predictor's eigenvalue, s = the eigenvalue of W Wᵀ (online network), τ = W_a / W
(EMA target over online), σ² = the augmentation variance, η = weight decay, α_p = the predictor's relative lr,
β = the EMA rate:

    ṗ = α_p · s · [τ − (1 + σ²) p] − η p
    ṡ = 2 p s [τ − (1 + σ²) p] − 2 η s
    τ̇ = β (1 − τ) − τ · ṡ / (2 s) = β (1 − τ) − τ · (p [τ − (1 + σ²) p] − η)        (SimSiam: τ ≡ 1)

Exact integral: c(t) = α_p⁻¹ p² − s decays as c(0)·e^(−2ηt), so with η > 0 every trajectory approaches the
parabola s = p²/α_p. On it, at fixed τ, ṗ = p (p [τ − (1 + σ²) p] − η): fixed points 0 and
p± = [τ ± √(τ² − 4η(1 + σ²))] / (2(1 + σ²)) when η ≤ τ²/(4(1 + σ²)) (0 and p+ stable, p− the edge of the
collapse basin); above that threshold only 0 (collapse). Integrated with scipy's solve_ivp (LSODA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp

from selfsup.errors import UserError


@dataclass
class ByolDynamicsConfig:
    """The system's parameters and what the run sweeps."""

    alpha_p: float = 1.0  # relative predictor lr
    sigma2: float = 1.0  # augmentation variance σ²
    eta: float = 0.05  # weight decay (threshold τ²/(4(1+σ²)) = 0.125 at τ = 1, σ² = 1)
    beta: float = 0.1  # EMA rate (BYOL)
    t_end: float = 400.0
    seed: int = 0

    def validate(self) -> None:
        if not self.alpha_p > 0:
            raise UserError(f"--alpha-p={self.alpha_p} must be > 0")
        if self.sigma2 < 0:
            raise UserError(f"--sigma2={self.sigma2} must be >= 0")
        if self.eta < 0:
            raise UserError(f"--eta={self.eta} must be >= 0")
        if not 0 < self.beta <= 10:
            raise UserError(f"--beta={self.beta} must be in (0, 10]")
        if not self.t_end > 0:
            raise UserError(f"--t-end={self.t_end} must be > 0")


def rhs(alpha_p: float, sigma2: float, eta: float, beta: float | None):
    """The vector field of (p, s, τ); ``beta=None`` is SimSiam (τ ≡ 1: τ̇ = 0 from τ = 1)."""

    def f(_t, y):
        p, s, tau = y
        drive = tau - (1 + sigma2) * p
        growth = p * drive - eta  # ṡ / (2s), finite as s → 0
        dtau = 0.0 if beta is None else beta * (1 - tau) - tau * growth
        return [alpha_p * s * drive - eta * p, 2 * s * growth, dtau]

    return f


def integrate(cfg_or_params, y0, t_end: float, beta: float | None = None, points: int = 400, **overrides):
    """Solve the system from y0 = (p, s, τ) on [0, t_end]; returns (t, p, s, τ) at ``points`` times."""
    params = dict(alpha_p=cfg_or_params.alpha_p, sigma2=cfg_or_params.sigma2, eta=cfg_or_params.eta)
    params.update(overrides)
    t_eval = np.linspace(0.0, t_end, points)
    sol = solve_ivp(rhs(beta=beta, **params), (0.0, t_end), list(y0), method="LSODA", t_eval=t_eval,
                    rtol=1e-10, atol=1e-12)
    if not sol.success:
        raise RuntimeError(f"solve_ivp failed: {sol.message}")
    return sol.t, sol.y[0], sol.y[1], sol.y[2]


def fixed_points(tau: float, sigma2: float, eta: float) -> list[float]:
    """The fixed points of p on the parabola s = p²/α_p at fixed τ: [0] or [0, p−, p+]."""
    disc = tau * tau - 4 * eta * (1 + sigma2)
    if disc < 0:
        return [0.0]
    root = math.sqrt(disc)
    return [0.0, (tau - root) / (2 * (1 + sigma2)), (tau + root) / (2 * (1 + sigma2))]


def eta_threshold(tau: float, sigma2: float) -> float:
    """The weight decay above which only the collapsed fixed point remains: τ²/(4(1 + σ²))."""
    return tau * tau / (4 * (1 + sigma2))


def on_parabola(cfg: ByolDynamicsConfig, p0: float, tau: float, t_end: float, eta: float | None = None) -> float:
    """p(t_end) from p0 on the parabola s = p²/α_p with τ held fixed."""
    eta = cfg.eta if eta is None else eta
    _, p, _, _ = integrate(cfg, (p0, p0 * p0 / cfg.alpha_p, tau), t_end, beta=None, points=2, eta=eta)
    return float(p[-1])


def basin_edge(cfg: ByolDynamicsConfig, tau: float, eta: float, iters: int = 40) -> float | None:
    """The collapse basin's edge found by bisection on p0 with the ODE (None above the threshold)."""
    fps = fixed_points(tau, cfg.sigma2, eta)
    if len(fps) == 1:
        return None
    lo, hi = 1e-9, fps[2]
    t_end = 60.0 / max(eta, 1e-3)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if on_parabola(cfg, mid, tau, t_end, eta) > 0.5 * fps[2]:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def run(cfg: ByolDynamicsConfig, progress=print) -> dict:
    """Every experiment: the invariant, fixed points and basins, the η and τ sweeps, α_p, EMA vs no EMA, portraits."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    sig = cfg.sigma2
    out: dict = {"config": dict(cfg.__dict__)}

    progress("byol-dynamics: invariant c = p²/α_p − s")
    inv = []
    for eta in (0.0, cfg.eta):
        p0, s0 = rng.uniform(0.2, 0.6), rng.uniform(0.05, 0.5)
        t, p, s, _ = integrate(cfg, (p0, s0, 0.5), cfg.t_end / 4, beta=cfg.beta, eta=eta)
        c = p * p / cfg.alpha_p - s
        expected = c[0] * np.exp(-2 * eta * t)
        err = float(np.max(np.abs(c - expected)) / abs(c[0]))
        keep = np.abs(c) > 1e-6 * abs(c[0])
        rate = float(-np.polyfit(t[keep], np.log(np.abs(c[keep])), 1)[0]) if keep.sum() > 2 else math.nan
        inv.append({"eta": eta, "c0": float(c[0]), "max_rel_error": err, "fitted_rate": rate, "expected_rate": 2 * eta})
    out["invariant"] = inv

    progress("byol-dynamics: fixed points on the parabola at tau = 1")
    fps = fixed_points(1.0, sig, cfg.eta)
    out["fixed_points"] = {"tau": 1.0, "eta": cfg.eta, "closed_form": fps}
    if len(fps) == 3:
        t_long = 80.0 / max(cfg.eta, 1e-3)
        above = on_parabola(cfg, fps[1] * 1.05, 1.0, t_long)
        below = on_parabola(cfg, fps[1] * 0.95, 1.0, t_long)
        start_high = on_parabola(cfg, 1.0, 1.0, t_long)
        out["fixed_points"].update(from_above_p_minus=above, from_below_p_minus=below, from_p1=start_high,
                                   basin_edge_numeric=basin_edge(cfg, 1.0, cfg.eta))

    progress("byol-dynamics: collapse basin against eta and tau")
    thr = eta_threshold(1.0, sig)
    etas = [thr * f for f in (0.05, 0.2, 0.4, 0.6, 0.8, 0.95)]
    taus = (0.5, 0.75, 1.0)
    sweep = []
    for tau in taus:
        for eta in etas:
            f = fixed_points(tau, sig, eta)
            sweep.append({"tau": tau, "eta": eta, "p_minus": f[1] if len(f) == 3 else None,
                          "p_plus": f[2] if len(f) == 3 else None,
                          "p_minus_numeric": basin_edge(cfg, tau, eta, iters=25) if tau == 1.0 else None})
    out["basin"] = sweep
    above_thr = 1.2 * thr
    t_c, p_c, s_c, _ = integrate(cfg, (1.0, 1.0 / cfg.alpha_p, 1.0), 40.0 / above_thr, beta=None, eta=above_thr)
    out["above_threshold"] = {"eta": above_thr, "threshold": thr, "p_end": float(p_c[-1]), "s_end": float(s_c[-1])}

    progress("byol-dynamics: relative predictor lr alpha_p (no weight decay, SimSiam tau = 1)")
    grid_p = np.linspace(-0.6, 0.6, 13)
    grid_s = np.linspace(0.02, 0.3, 8)
    alphas = (0.25, 1.0, 4.0, 16.0, 64.0)
    alpha_rows = []
    for a in alphas:
        collapsed, growth = 0, []
        for p0 in grid_p:
            for s0 in grid_s:
                _, p, s, _ = integrate(cfg, (p0, s0, 1.0), 200.0, beta=None, points=2, alpha_p=a, eta=0.0)
                collapsed += s[-1] < 1e-3 * s0
                growth.append(s[-1] / s0)
        alpha_rows.append({"alpha_p": a, "collapsed_fraction": collapsed / (len(grid_p) * len(grid_s)),
                           "median_s_growth": float(np.median(growth))})
    out["alpha_p"] = alpha_rows

    progress("byol-dynamics: EMA as a curriculum (BYOL, several beta) vs SimSiam (tau = 1)")
    betas = (cfg.beta * 4, cfg.beta, cfg.beta / 4)
    p0, s0 = 0.1, 0.01
    ema = []
    for beta in betas:  # the target starts as a copy of the online network: tau(0) = 1
        t, p, s, tau = integrate(cfg, (p0, s0, 1.0), cfg.t_end, beta=beta)
        ema.append(_trajectory_summary("byol", beta, t, p, s, tau, sig, cfg.eta))
    t, p, s, tau = integrate(cfg, (p0, s0, 1.0), cfg.t_end, beta=None)
    ema.append(_trajectory_summary("simsiam", None, t, p, s, tau, sig, cfg.eta))
    out["ema"] = ema
    small = []
    for beta in betas:  # tau(0) = 0 (the paper's closed form): a slow EMA keeps tau, and the goal p+(tau), small
        t, p, s, tau = integrate(cfg, (p0, s0, 0.0), cfg.t_end, beta=beta)
        small.append({"beta": beta, "p_end": float(p[-1]), "s_end": float(s[-1]), "tau_end": float(tau[-1])})
    out["ema_small_tau"] = small
    return out


def _trajectory_summary(kind, beta, t, p, s, tau, sigma2, eta) -> dict:
    final = s[-1]
    reach = t[np.argmax(s >= 0.9 * final)] if final > 1e-9 else None
    goal = np.array([fixed_points(x, sigma2, eta)[-1] for x in tau])  # p+ of the current τ (0 if none)
    late = t > 0.1 * t[-1]
    return {"kind": kind, "beta": beta, "t": t.tolist(), "p": p.tolist(), "s": s.tolist(), "tau": tau.tolist(),
            "p_end": float(p[-1]), "s_end": float(final), "tau_end": float(tau[-1]), "tau_min": float(tau.min()),
            "t_90": None if reach is None else float(reach),
            "tracking_error": float(np.mean(np.abs(p[late] - goal[late])))}


def checks(result: dict, cfg: ByolDynamicsConfig) -> list[dict]:
    """Which of the paper's observations this run shows."""
    rows = []
    inv = result["invariant"]
    rows.append({"claim": "eta = 0: c = p^2/alpha_p - s is conserved (trajectories on parabolas)",
                 "measured": f"max |c(t) - c(0)| / |c(0)| = {inv[0]['max_rel_error']:.1e}",
                 "confirmed": inv[0]["max_rel_error"] < 1e-5})
    rows.append({"claim": "eta > 0: c decays exactly as e^(-2 eta t)",
                 "measured": f"fitted rate {inv[1]['fitted_rate']:.5f} vs 2 eta = {inv[1]['expected_rate']:.5f}; "
                             f"max deviation {inv[1]['max_rel_error']:.1e} of c(0)",
                 "confirmed": inv[1]["max_rel_error"] < 1e-5})
    fp = result["fixed_points"]
    if "from_above_p_minus" in fp:
        _, pm, pp = fp["closed_form"]
        err = abs(fp["from_above_p_minus"] - pp) / pp
        rows.append({"claim": "fixed points 0 and p+ stable, p- the basin edge (closed form)",
                     "measured": f"p- = {pm:.4f} (bisection {fp['basin_edge_numeric']:.4f}), p+ = {pp:.4f}; from "
                                 f"1.05 p- -> {fp['from_above_p_minus']:.4f}, "
                                 f"0.95 p- -> {fp['from_below_p_minus']:.1e}",
                     "confirmed": err < 1e-4 and abs(fp["from_below_p_minus"]) < 1e-3 * pp
                     and abs(fp["basin_edge_numeric"] - pm) < 1e-3 * pm})
    b1 = [r for r in result["basin"] if r["tau"] == 1.0 and r["p_minus"] is not None]
    grows = all(x["p_minus"] < y["p_minus"] for x, y in zip(b1, b1[1:]))
    rows.append({"claim": "Obs#4: the collapse basin (p < p-) grows with eta",
                 "measured": ", ".join(f"eta {r['eta']:.3f}: {r['p_minus']:.3f}" for r in b1), "confirmed": grows})
    eta0 = sorted({r["eta"] for r in result["basin"]})[1]  # a weight decay every tau has a basin edge for
    by_tau = [r for r in result["basin"] if r["eta"] == eta0 and r["p_minus"] is not None]
    shrinks = all(x["p_minus"] > y["p_minus"] for x, y in zip(by_tau, by_tau[1:]))
    rows.append({"claim": "Obs#10: a smaller tau widens the collapse basin",
                 "measured": ", ".join(f"tau {r['tau']}: p- {r['p_minus']:.3f}" for r in by_tau), "confirmed": shrinks})
    a = result["above_threshold"]
    rows.append({"claim": "Obs#5: eta > tau^2/(4(1+sigma^2)) collapses from any start",
                 "measured": f"eta = {a['eta']:.3f} (> {a['threshold']:.3f}), from p = 1: p -> {a['p_end']:.1e}, "
                             f"s -> {a['s_end']:.1e}", "confirmed": abs(a["p_end"]) < 1e-3 and a["s_end"] < 1e-3})
    al = result["alpha_p"]
    fewer = all(x["collapsed_fraction"] >= y["collapsed_fraction"] for x, y in zip(al, al[1:])) and \
        al[0]["collapsed_fraction"] > al[-1]["collapsed_fraction"]
    rows.append({"claim": "Obs#1: a faster predictor (larger alpha_p) shrinks the collapse basin",
                 "measured": ", ".join(f"alpha_p {r['alpha_p']:g}: {r['collapsed_fraction']:.2f}" for r in al),
                 "confirmed": bool(fewer)})
    rows.append({"claim": "Obs#2: ... but a very fast predictor stops s from growing",
                 "measured": ", ".join(f"alpha_p {r['alpha_p']:g}: s x{r['median_s_growth']:.2f}" for r in al),
                 "confirmed": al[-1]["median_s_growth"] < 1.1 < al[1]["median_s_growth"]})
    ema = result["ema"]
    byol = [e for e in ema if e["kind"] == "byol"]
    t90 = [e["t_90"] for e in byol]
    slower = all(x is not None and y is not None and x < y for x, y in zip(t90, t90[1:]))
    rows.append({"claim": "Obs#9: a slower EMA (smaller beta) trains more slowly",
                 "measured": ", ".join(f"beta {e['beta']:g}: t90 {e['t_90']:.1f}" if e["t_90"] is not None else
                                       f"beta {e['beta']:g}: never" for e in byol), "confirmed": slower})
    fp_goal = fixed_points(1.0, cfg.sigma2, cfg.eta)[-1]
    ok = all(e["tau_min"] < 0.95 and abs(e["tau_end"] - 1) < 2e-2 and abs(e["p_end"] - fp_goal) < 2e-2 * fp_goal
             for e in byol)
    rows.append({"claim": "Obs#8: EMA as a curriculum: while W grows tau dips (a lower goal p+(tau)), then returns "
                          "to 1 and p reaches p+(1)",
                 "measured": "; ".join(f"beta {e['beta']:g}: tau min {e['tau_min']:.2f} -> {e['tau_end']:.3f}, p_end "
                                       f"{e['p_end']:.3f} (p+ {fp_goal:.3f})" for e in byol), "confirmed": ok})
    sm = result["ema_small_tau"]
    trapped = [e for e in sm if abs(e["p_end"]) < 1e-3]
    rows.append({"claim": "Obs#10: with tau(0) = 0 a slow EMA keeps tau small and traps the mode in the collapse basin",
                 "measured": ", ".join(f"beta {e['beta']:g}: p_end {e['p_end']:.3f}" for e in sm),
                 "confirmed": bool(trapped) and abs(sm[0]["p_end"]) > 1e-3 and abs(sm[-1]["p_end"]) < 1e-3})
    return rows


def plot(result: dict, cfg: ByolDynamicsConfig, path) -> None:
    """Phase portraits (Fig. 3: no weight decay, below and above the threshold), EMA curriculum (Fig. 5),
    the collapse basin against η and τ, and the α_p sweep."""
    import matplotlib  # lazy: the Agg backend is chosen before pyplot, on the one path that draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    sig, a = cfg.sigma2, cfg.alpha_p
    thr = eta_threshold(1.0, sig)
    pg = np.linspace(-0.2, 0.8, 41)
    sg = np.linspace(0.0, 0.6, 41)
    P, S = np.meshgrid(pg, sg)
    for ax, eta, title in zip(axes[0], (0.0, cfg.eta, 1.5 * thr),
                              ("no weight decay", f"eta = {cfg.eta:g} < threshold",
                               f"eta = {1.5 * thr:.3g} > threshold")):
        f = rhs(a, sig, eta, None)
        dp, ds, _ = f(0, (P, S, np.ones_like(P)))
        ax.streamplot(P, S, dp, ds, density=0.9, color="tab:blue", linewidth=0.6, arrowsize=0.7)
        ax.plot(pg, pg ** 2 / a, "k--", lw=1, label="s = p²/α_p")
        for fp in fixed_points(1.0, sig, eta):
            ax.plot(fp, fp * fp / a, "o", color="tab:red" if fp else "k", ms=6)
        if eta == 0:
            ax.axvline(1 / (1 + sig), color="tab:green", lw=1, label="p = τ/(1+σ²)")
        ax.set(xlim=(pg[0], pg[-1]), ylim=(sg[0], sg[-1]), xlabel="p (predictor)", ylabel="s (online, W Wᵀ)",
               title=f"SimSiam (τ = 1): {title}")
        ax.legend(fontsize=7, loc="upper left")
    ax = axes[1, 0]
    for e in result["ema"]:
        lab = "SimSiam (τ≡1)" if e["kind"] == "simsiam" else f"BYOL β={e['beta']:g}"
        line, = ax.plot(e["t"], e["s"], label=f"s, {lab}")
        if e["kind"] == "byol":
            ax.plot(e["t"], e["tau"], ":", color=line.get_color(), lw=1)
    ax.set(xlabel="t", ylabel="s (solid), τ (dotted)", title="EMA as a curriculum (Fig. 5)")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for tau in sorted({r["tau"] for r in result["basin"]}):
        rows = [r for r in result["basin"] if r["tau"] == tau and r["p_minus"] is not None]
        etas = np.linspace(0, eta_threshold(tau, sig), 100)
        ax.plot(etas, [fixed_points(tau, sig, x)[1] for x in etas], label=f"p− (τ = {tau})")
        num = [(r["eta"], r["p_minus_numeric"]) for r in rows if r["p_minus_numeric"] is not None]
        if num:
            ax.plot(*zip(*num), "kx", ms=5)
    ax.set(xlabel="weight decay η", ylabel="collapse basin edge p−", title="collapse basin (x: ODE bisection)")
    ax.legend(fontsize=7)
    ax = axes[1, 2]
    al = result["alpha_p"]
    ax.semilogx([r["alpha_p"] for r in al], [r["collapsed_fraction"] for r in al], "o-", label="collapsed fraction")
    ax.semilogx([r["alpha_p"] for r in al], [r["median_s_growth"] for r in al], "s-", label="median s(∞)/s(0)")
    ax.set(xlabel="relative predictor lr α_p", title="α_p: basin vs growth (η = 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict) -> list[str]:
    fp = result["fixed_points"]
    lines = [f"fixed points at tau=1, eta={fp['eta']:g}: " + ", ".join(f"{x:.4f}" for x in fp["closed_form"])]
    lines.append(f"{'tau':>5} {'eta':>7} {'p- closed':>10} {'p- ODE':>8} {'p+':>7}")
    for r in result["basin"]:
        if r["p_minus"] is None:
            continue
        num = f"{r['p_minus_numeric']:.4f}" if r["p_minus_numeric"] is not None else "-"
        lines.append(f"{r['tau']:>5} {r['eta']:>7.4f} {r['p_minus']:>10.4f} {num:>8} {r['p_plus']:>7.4f}")
    return lines
