"""bench.quality.compat: equal trial budgets, edge flags, instance metrics and the auto row in every
scenario, the query→document part, and the targets — on the committed fixture."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench.quality import (
    compat,
    compat_grid,
    compat_report,
    compat_scenarios,
    compat_widen,
    querydoc,
)


def test_every_method_gets_the_same_number_of_trials() -> None:
    for trials in (2, compat_grid.TRIALS):
        counts = {m: len(g.settings(trials)) for m, g in compat_grid.GRIDS.items()}
        assert counts.pop("procrustes") == 1  # closed form: nothing to tune
        assert set(counts.values()) == {trials}
    # Two trials are the grid's two ends, so a quick run still spans the whole axis.
    two = compat_grid.GRIDS["l2"].settings(2)
    assert [s["compat_weight"] for s in two] == [min(compat_grid.WEIGHTS), max(compat_grid.WEIGHTS)]


def test_edge_flags_ends_but_not_the_natural_bound() -> None:
    grid = compat_grid.Grid("compat_weight", (0.1, 1.0, 10.0))
    trials = grid.settings(3)
    assert compat_grid.edge_of(grid, trials, 0) == "low"
    assert compat_grid.edge_of(grid, trials, 1) is None
    assert compat_grid.edge_of(grid, trials, 2) == "high"
    bounded = compat_grid.GRIDS["hbct"]
    trials = bounded.settings(compat_grid.TRIALS)
    assert compat_grid.edge_of(bounded, trials, 0) is None  # weight 0 = the paper's loss
    assert compat_grid.edge_of(bounded, trials, len(trials) - 1) == "high"
    ranks = compat_grid.Grid("adapter_rank", (4, 8, 16))
    ones = [{"adapter_rank": r} for r in (1, 4, 16)]
    assert compat_grid.edge_of(ranks, ones, 0) is None  # nothing below rank 1


STAY_CLASS = {"cmc1": 0.60, "map@100": 0.30}


def _entry(new_old: float, p_up_cmc: float, reference: float = 0.70) -> dict:
    """An assembled validation entry: new→old metrics ``new_old`` (both), P_com against a
    reference at ``reference`` over stay's ``STAY_CLASS``."""
    return {
        "class": {"cmc1": new_old, "map@100": new_old - 0.3},
        "p_com": {
            "cmc1": (new_old - 0.60) / (reference - 0.60),
            "map@100": (new_old - 0.60) / (reference - 0.60),
        },
        "p_up": {"cmc1": p_up_cmc, "map@100": 0.0},
    }


def test_bridge_score_puts_the_p_up_floor_first() -> None:
    feasible = compat_grid.bridge_score(_entry(0.62, 0.0), STAY_CLASS)
    costly = compat_grid.bridge_score(_entry(0.69, -0.02), STAY_CLASS)
    assert feasible[0] and not costly[0]
    assert max(feasible, costly) == feasible


def test_bridge_score_ranks_by_new_to_old_when_the_reference_is_below_stay() -> None:
    # On a validation split the reference can fall below stay (extended-data: the old and new
    # heads share the backbone); P_com's denominator is then negative and its order inverted.
    near_stay = _entry(0.59, 0.0, reference=0.599)
    collapsed = _entry(0.05, 0.0, reference=0.599)
    assert collapsed["p_com"]["cmc1"] > near_stay["p_com"]["cmc1"]
    better = compat_grid.bridge_score(near_stay, STAY_CLASS)
    assert better > compat_grid.bridge_score(collapsed, STAY_CLASS)
    # Where the reference is above stay the order is P_com's.
    low, high = _entry(0.62, 0.0), _entry(0.66, 0.0)
    assert high["p_com"]["cmc1"] > low["p_com"]["cmc1"]
    assert compat_grid.bridge_score(high, STAY_CLASS) > compat_grid.bridge_score(low, STAY_CLASS)


@pytest.fixture(scope="module")
def quick_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two seeds of the external scenario run as units (as the full run spreads them over
    processes), then combined with the query→document part read from bench.quality.querydoc's file."""
    folder = tmp_path_factory.mktemp("compat")
    base = ["--quick", "--scenarios", "external"]
    # The methods in two halves, as the full run spreads them.
    halves = (
        "independent,hbct,l2,bct,contrastive",
        "procrustes,affine,mlp-adapter,instance-map,class-map",
    )
    selects = []
    for i, half in enumerate(halves):
        out = folder / f"select-{i}.json"
        selects.append(
            compat.main([*base, "--unit", "select", "--methods", half, "--out", str(out)])
        )
    units = list(selects)
    for seed in (0, 1):
        out = folder / f"auto-{seed}.json"
        units.append(compat.main([*base, "--unit", "auto", "--seed", str(seed), "--out", str(out)]))
        for i, half in enumerate(halves):
            out = folder / f"methods-{seed}-{i}.json"
            argv = ["--unit", "methods", "--seed", str(seed), "--methods", half, "--out", str(out)]
            units.append(compat.main([*base, *argv, "--selection", *map(str, selects)]))
    out = folder / "quick.json"
    combine = ["--quick", "--combine", *map(str, units), "--querydoc", "reuse"]
    compat.main([*combine, "--no-markdown", "--out", str(out)])
    return json.loads(out.read_text())


def test_quick_run_measures_every_method_and_auto_in_both_views(quick_payload: dict) -> None:
    (sc,) = quick_payload["scenarios"]
    assert sc["scenario"]["name"] == "external" and len(sc["runs"]) == 2
    assert quick_payload["units"] == 8 and quick_payload["seeds"] == 2
    trials = sc["selection"]["trials"]
    base, most = compat.QUICK.trials, compat.QUICK.trials + compat.QUICK.extend_rounds
    assert all(base <= len(t) <= most for m, t in trials.items() if m != "procrustes")
    assert quick_payload["extend_rounds"] == compat.QUICK.extend_rounds
    rows = sc["summary"]["rows"]
    for name in (*compat_grid.BRIDGES, "auto"):
        for key in ("instance.recall@1", "instance.recall@10", "instance.mrr@100"):
            assert 0.0 <= rows[name][key][0] <= 1.0, (name, key)
        assert rows[name]["p_com.cmc1"] is not None and rows[name]["p_up.cmc1"] is not None
    # Stay finds every item's own old vector first; the chosen auto candidate is recorded per seed.
    assert rows["stay"]["instance.recall@1"][0] == 1.0
    assert len(sc["summary"]["auto_chosen"]) == 2
    assert set(sc["summary"]["reference"]["cmc1"]) <= {"raw_new", "independent"}
    assert sc["selection"]["edge"].keys() == compat_grid.GRIDS.keys()
    candidates = {row[0]: row for row in compat_report.auto_candidates(sc["runs"])}
    assert candidates["procrustes"][3] == "2/2"  # never below itself
    assert sum(int(row[4].split("/")[0]) for row in candidates.values()) == 2


def test_quick_run_renders_targets_and_the_query_document_part(quick_payload: dict) -> None:
    qd = quick_payload["querydoc"]
    for variant in querydoc.VARIANTS:
        assert qd["instance"][variant]["auto"]["recall@10"] is not None
    lines = compat_report.target_lines(quick_payload)
    ours = [line for line in lines if not line.startswith("- query → document")]
    check_target_lines(ours, quick_payload)
    # bench.quality.querydoc's own target lines, carried over as it words them, and what its
    # carried summary gives (its lines are checked against their figures in its own tests).
    carried = [f"- query → document, {line[2:]}" for line in querydoc.targets(qd["summary"])]
    assert lines[len(ours) :] == carried and qd["targets"] == querydoc.targets(qd["summary"])
    text = compat_report.render_markdown(quick_payload)
    assert "| **auto** |" in text and "### query → document" in text
    # The units put auto's part first; the table still lists it after every single method.
    lines = text.splitlines()
    first = {
        row: next(i for i, x in enumerate(lines) if x.startswith(row))
        for row in ("| **auto** |", "| class-map | ")
    }
    assert first["| **auto** |"] > first["| class-map | "]
    assert "own-item R@10" in text and "stronger:" in text


# The targets, restated here so that the lines are checked against the figures.
P_COM_TARGET, P_UP_FLOOR, INSTANCE_SHARE = 0.70, -0.01, 0.95


def _expected_targets(payload: dict) -> list[tuple[list[str], bool, float | None]]:
    """Per target line, in order: (figures the line must show, met, the margin a miss states)."""
    out: list[tuple[list[str], bool, float | None]] = []

    def value(rows: dict, row: str, key: str) -> float | None:
        pair = rows.get(row, {}).get(key)
        return None if pair is None else pair[0]

    for sc in payload["scenarios"]:
        rows = sc["summary"]["rows"]
        own, proc = (
            value(rows, "auto", "instance.recall@1"),
            value(rows, "procrustes", "instance.recall@1"),
        )
        if own is not None and proc:
            share = own / proc
            shown = [f"{own:.3f}", f"{share:.3f}", f"{proc:.3f}"]
            out.append((shown, share >= INSTANCE_SHARE, INSTANCE_SHARE - share))
        if sc["scenario"]["name"] != "external":
            continue
        pc, pu = value(rows, "auto", "p_com.cmc1"), value(rows, "auto", "p_up.cmc1")
        if pc is not None:
            out.append(([f"{pc:.3f}"], pc >= P_COM_TARGET, P_COM_TARGET - pc))
        if pu is not None:
            out.append(([f"{pu:+.3f}"], pu >= P_UP_FLOOR, P_UP_FLOOR - pu))
        singles = {m: value(rows, m, "p_com.cmc1") for m in compat_grid.BRIDGES}
        singles = {m: v for m, v in singles.items() if v is not None}
        if pc is None or not singles:
            continue
        # Above the best single method, and above the best of those that keep own-item R@1.
        for rivals in (
            singles,
            {
                m: v
                for m, v in singles.items()
                if proc
                and (r1 := value(rows, m, "instance.recall@1")) is not None
                and r1 >= INSTANCE_SHARE * proc
            },
        ):
            if rivals:
                best = max(rivals.values())
                out.append(([f"{pc:.3f}", f"{best:.3f}"], pc > best, best - pc))
    for sc in payload["scenarios"]:
        edges = [m for m, e in sc["selection"]["edge"].items() if e]
        out.append(([f"{len(edges)} of"] if edges else [], not edges, None))
    return out


def check_target_lines(lines: list[str], payload: dict) -> None:
    """Each line shows its figures and states the verdict they give: "met", else "missed by"
    the gap (or, for grid edges, "missed for" the number of methods on an edge)."""
    expected = _expected_targets(payload)
    assert len(lines) == len(expected), lines
    for line, (shown, met, margin) in zip(lines, expected, strict=True):
        if met:
            assert line.endswith(" — met"), line
        elif margin is None:
            assert " — missed for " in line and not line.endswith("met"), line
        else:
            assert line.endswith(f" — missed by {margin:.3f}"), (line, margin)
        assert all(figure in line for figure in shown), (line, shown)


def _scenario(auto: tuple[float, float, float], best_single: float) -> dict:
    p_com, p_up, own = auto
    rows = {
        "auto": {
            "p_com.cmc1": [p_com, 0.0],
            "p_up.cmc1": [p_up, 0.0],
            "instance.recall@1": [own, 0.0],
        },
        "procrustes": {"p_com.cmc1": [best_single, 0.0], "instance.recall@1": [1.0, 0.0]},
        # Tuned for class alone: a higher P_com at half the own-item R@1.
        "class-map": {"p_com.cmc1": [0.9, 0.0], "instance.recall@1": [0.5, 0.0]},
    }
    return {
        "scenario": {"name": "external"},
        "summary": {"rows": rows},
        "selection": {"edge": {m: None for m in compat_grid.GRIDS}},
    }


def test_targets_say_met_or_by_how_much_they_are_missed() -> None:
    lines = compat_report.target_lines({"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]})
    assert len(lines) == 6
    assert "missed by 0.150" in lines[3]  # below class-map tuned for class alone (0.9)
    # Among the methods that keep the instance floor (procrustes, 0.5), auto is above.
    assert "keeps own-item R@1" in lines[4] and "best procrustes 0.500" in lines[4]
    met = lines[:3] + lines[4:]
    assert all(line.endswith("met") for line in met)
    short = compat_report.target_lines({"scenarios": [_scenario((0.65, -0.03, 0.90), 0.7)]})
    assert "missed by 0.050" in short[0]  # own-item R@1 0.90 = 0.90 × procrustes's
    assert "missed by 0.050" in short[1]  # P_com 0.65 < 0.70
    assert "missed by 0.020" in short[2]  # P_up −0.03 < −0.01
    assert "missed by 0.250" in short[3]  # below the best single method
    assert "missed by 0.050" in short[4]  # below procrustes, which keeps the floor
    sc = _scenario((0.75, 0.0, 0.96), 0.5)
    sc["selection"]["edge"]["l2"] = "high"
    edge = compat_report.target_lines({"scenarios": [sc]})[-1]
    tuned = sum(1 for g in compat_grid.GRIDS.values() if g.axis)
    assert "l2 (high end)" in edge and edge.endswith(f"missed for 1 of {tuned} tuned methods")


def test_the_target_check_follows_the_figures_and_fails_on_a_wrong_line() -> None:
    assert (compat_report.TARGET_P_COM, compat_report.P_UP_FLOOR) == (P_COM_TARGET, P_UP_FLOOR)
    assert compat_report.INSTANCE_FLOOR == INSTANCE_SHARE
    good = {"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]}
    short = {"scenarios": [_scenario((0.65, -0.03, 0.90), 0.7)]}
    edged = {"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]}
    edged["scenarios"][0]["selection"]["edge"]["l2"] = "high"
    for payload in (good, short, edged):
        check_target_lines(compat_report.target_lines(payload), payload)
    lines = compat_report.target_lines(short)
    for wrong in (
        [lines[0].replace("missed by 0.050", "met"), *lines[1:]],  # a miss reported as met
        [lines[0], lines[1].replace("0.050", "0.005"), *lines[2:]],  # a wrong margin
        compat_report.target_lines(good),  # lines read from other figures
        lines[:-1],  # a line missing
    ):
        with pytest.raises(AssertionError):
            check_target_lines(wrong, short)
    # A met line whose figure is not the payload's.
    lines = compat_report.target_lines(good)
    with pytest.raises(AssertionError):
        check_target_lines([lines[0], lines[1].replace("0.750", "0.760"), *lines[2:]], good)
    with pytest.raises(AssertionError):  # an edge left unreported
        check_target_lines(lines, edged)


def test_merge_keeps_the_benchmark_order(tmp_path: Path) -> None:
    def payload(name: str, minutes: float) -> dict:
        sc = _scenario((0.75, 0.0, 0.96), 0.5)
        sc["scenario"]["name"] = name
        return {
            "command": f"run {name}",
            "elapsed_minutes": minutes,
            "scenarios": [sc],
            "note": f"only {name} run",
        }

    paths = []
    for name, minutes in (("external", 2.0), ("new-architecture", 3.0)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(payload(name, minutes)))
    order = [s.name for s in compat_scenarios.SCENARIOS]
    out = tmp_path / "merged.json"
    compat_report.merge_runs(paths, out, order, markdown=False)
    merged = json.loads(out.read_text())
    assert [s["scenario"]["name"] for s in merged["scenarios"]] == ["new-architecture", "external"]
    assert merged["elapsed_minutes"] == 5.0
    assert merged["command"] == "run external and run new-architecture"
    assert merged["note"] == "only external run"
    assert merged["units"] == 2
    compat_report.merge_runs(paths, out, order, markdown=False, note="every scenario run")
    assert json.loads(out.read_text())["note"] == "every scenario run"
    # A query→document part read again (bench.quality.querydoc rerun since) replaces the files' own.
    fresh = {"targets": ["- with query log: auto ARR(R@10) 0.9 (target ≥ 0.87) — met"]}
    compat_report.merge_runs(paths, out, order, markdown=False, querydoc_part=fresh)
    assert json.loads(out.read_text())["querydoc"] == fresh


def test_mean_sd_skips_missing_values() -> None:
    assert compat_report.mean_sd([None, float("nan")]) is None
    mean, sd = compat_report.mean_sd([0.5, None, 0.7])  # type: ignore[misc]
    assert mean == pytest.approx(0.6) and sd == pytest.approx(np.std([0.5, 0.7], ddof=1))


def test_select_units_merge_and_must_agree() -> None:
    ind = {"trials": {"independent": [1]}, "chosen": {"independent": {"t": 1}}, "edge": {}}
    a = {**ind, "chosen": {**ind["chosen"], "l2": {"w": 1}}, "edge": {"l2": None}}
    b = {**ind, "chosen": {**ind["chosen"], "affine": {"r": 2}}, "edge": {"affine": "low"}}
    merged = compat_report.merge_selections([a, b])
    assert set(merged["chosen"]) == {"independent", "l2", "affine"}
    assert merged["edge"] == {"l2": None, "affine": "low"}
    other = {**b, "chosen": {"independent": {"t": 2}}}
    with pytest.raises(ValueError, match="disagree"):
        compat_report.merge_selections([a, other])


def test_beyond_steps_one_grid_ratio_past_an_end() -> None:
    weights = compat_grid.Grid("compat_weight", compat_grid.WEIGHTS)
    assert weights.beyond([0.1, 1.0, 10.0], "high") == 33.3
    assert weights.beyond([0.1, 1.0, 10.0], "low") == 0.0333
    ranks = compat_grid.Grid("adapter_rank", (4, 8, 16))
    assert ranks.beyond([4, 16], "low") == 2
    assert ranks.beyond([1, 4, 16], "low") is None  # nothing below rank 1
    assert ranks.beyond([4, 16], "high") == 32
    # The natural bound is not widened past: weight 0 is the paper's loss.
    assert compat_grid.GRIDS["hbct"].beyond([0.0, 10.0, 100.0], "low") is None


def test_tune_widens_past_an_end_until_the_best_is_inside() -> None:
    grid = compat_grid.Grid("compat_weight", compat_grid.WEIGHTS)
    trained: list[float] = []

    def run_trial(settings: dict) -> dict:
        trained.append(settings["compat_weight"])
        # A validation score peaking at 40, past the grid's high end.
        return {"settings": settings, "score": -abs(np.log10(settings["compat_weight"] / 40))}

    def score(trial: dict) -> float:
        return trial["score"]

    base = grid.settings(3)
    trials, best, edge = compat_grid.tune(grid, base, {}, run_trial, score, [], 2)
    assert trained == [0.1, 1.0, 10.0, 33.3, 111.0]
    assert trials[best]["settings"] == {"compat_weight": 33.3} and edge is None
    # Capped: one round leaves the best at the end it reached, and says so.
    trained.clear()
    trials, best, edge = compat_grid.tune(grid, base, {}, run_trial, score, [], 1)
    assert trials[best]["settings"] == {"compat_weight": 33.3} and edge == "high"
    # An earlier selection's trials are taken, not retrained.
    earlier = [{"settings": {"compat_weight": 0.1}, "score": -99.0}]
    trained.clear()
    trials, _, _ = compat_grid.tune(grid, base, {}, run_trial, score, earlier, 0)
    assert trained == [1.0, 10.0] and trials[0] is earlier[0]


def test_widen_trains_only_new_trials_and_keeps_unmoved_rows(
    quick_payload: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.ml.upgrade.pipeline import UpgradeContext

    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps(quick_payload))
    calls: list[str] = []
    train = UpgradeContext.train

    def counting(self, method, *args, **kwargs):
        calls.append(method)
        return train(self, method, *args, **kwargs)

    monkeypatch.setattr(UpgradeContext, "train", counting)
    # Under the rule it was selected with, widening trains only the reuse check (one stored
    # trial retrained) and changes no figure.
    same = json.loads(compat.main(["--quick", "--widen", str(previous)]).read_text())
    (old_sc,), (same_sc,) = quick_payload["scenarios"], same["scenarios"]
    assert calls == [compat_widen.CHECKED_METHOD]
    assert same_sc["selection"] == old_sc["selection"]
    for old_run, run in zip(old_sc["runs"], same_sc["runs"], strict=True):
        assert run["metrics"] == old_run["metrics"]
    # One more round: only trials past a remaining edge are trained; unmoved rows keep figures.
    monkeypatch.setattr(compat, "QUICK", dataclasses.replace(compat.QUICK, extend_rounds=2))
    out = tmp_path / "widened.json"
    (sc,) = json.loads(
        compat.main(["--quick", "--widen", str(previous), "--out", str(out)]).read_text()
    )["scenarios"]
    before, after = old_sc["selection"], sc["selection"]
    new_trials = 0
    for method, trials in after["trials"].items():
        assert trials[: len(before["trials"][method])] == before["trials"][method]
        new_trials += len(trials) - len(before["trials"][method])
        if len(trials) > len(before["trials"][method]):
            assert before["edge"][method] is not None
    assert new_trials > 0  # the quick selection leaves edges a second round widens
    moved = [m for m in compat_grid.METHODS if after["chosen"][m] != before["chosen"][m]]
    if "independent" in moved:  # its temperature and reference reach every method
        moved = list(compat_grid.METHODS)
    assert len(calls) == 2 + new_trials + len(moved) * len(sc["runs"])  # 2 reuse checks
    for old_run, run in zip(old_sc["runs"], sc["runs"], strict=True):
        for method in set(compat_grid.BRIDGES) - set(moved) | {"auto"}:
            assert run["metrics"][method] == old_run["metrics"][method], method


def test_widen_refuses_trials_the_current_code_does_not_reproduce(
    quick_payload: dict, tmp_path: Path
) -> None:
    tampered = json.loads(json.dumps(quick_payload))
    (sc,) = tampered["scenarios"]
    trial = sc["selection"]["trials"][compat_widen.CHECKED_METHOD][0]
    trial["val"]["instance"]["recall@1"] -= 0.01  # as if trained by other code
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(tampered))
    with pytest.raises(ValueError, match="do not reproduce"):
        compat.main(["--quick", "--widen", str(path), "--out", str(tmp_path / "out.json")])
