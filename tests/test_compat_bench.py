"""bench.quality.compat: equal trial budgets, edge flags, instance metrics and the auto row in every
scenario, the query→document part, and the targets — on the committed fixture."""

import json
import math
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from app.ml.auto import halving
from bench.common.machine import uncommitted_phrase
from bench.common.stats import t_interval
from bench.common.wordnet import FIXTURE_DATA_DIR, REPO_ROOT, fine_labels, load_wordnet
from bench.quality import (
    compat,
    compat_grid,
    compat_report,
    compat_scenarios,
    continual_report,
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


def test_bridge_score_needs_the_instance_floor_when_given() -> None:
    entry = {**_entry(0.66, 0.0), "instance": {"recall@1": 0.80}}
    assert compat_grid.bridge_score(entry, STAY_CLASS)[0]
    assert compat_grid.bridge_score(entry, STAY_CLASS, instance_floor=0.79)[0]
    below = compat_grid.bridge_score(entry, STAY_CLASS, instance_floor=0.81)
    kept = compat_grid.bridge_score(
        {**_entry(0.62, 0.0), "instance": {"recall@1": 0.90}}, STAY_CLASS, instance_floor=0.81
    )
    # A higher class gain below the floor ranks under a lower one that keeps it.
    assert not below[0] and kept[0] and max(below, kept) == kept
    # Under the instance floor, as for auto's candidates, P_up is reported, not a floor.
    costly = {**_entry(0.62, -0.05), "instance": {"recall@1": 0.90}}
    assert compat_grid.bridge_score(costly, STAY_CLASS, instance_floor=0.81)[0]
    assert not compat_grid.bridge_score(costly, STAY_CLASS)[0]


def test_every_seed_draws_its_own_split_and_never_the_held_back_items() -> None:
    n = 1000
    parts = [compat_scenarios.split_items(n, seed) for seed in range(3)]
    held = parts[0]["held_back"]
    assert held.size == round(compat_scenarios.HELD_BACK_FRACTION * n)
    for p in parts:
        assert np.array_equal(p["held_back"], held)  # recorded once, the same for every seed
        assert np.intersect1d(np.concatenate([p["train"], p["evaluation"]]), held).size == 0
        assert np.array_equal(
            np.union1d(p["train"], p["evaluation"]), np.setdiff1d(np.arange(n), held)
        )
        assert np.intersect1d(p["train"], p["evaluation"]).size == 0
        assert np.array_equal(np.union1d(p["fit"], p["validation"]), p["train"])
        assert np.intersect1d(p["fit"], p["validation"]).size == 0
    assert not np.array_equal(parts[0]["evaluation"], parts[1]["evaluation"])
    assert not np.array_equal(parts[1]["validation"], parts[2]["validation"])
    again = compat_scenarios.split_items(n, 1)
    assert all(np.array_equal(again[k], parts[1][k]) for k in again)  # recorded seed: reproducible


def test_the_frozen_held_back_items_are_the_ones_a_final_run_scores(monkeypatch, tmp_path) -> None:
    """Issue 42 item 3: ``held_back_synsets`` lists the fine-class rows every seed's split holds
    back, its digest is what ``HELD_BACK_SHA256`` freezes, another draw changes it, and a
    ``--final`` run whose items are not the frozen ones is refused before any training."""
    meta = load_wordnet(FIXTURE_DATA_DIR, fields=()).meta
    keep, _ = fine_labels(meta)
    held = compat_scenarios.split_items(keep.size, seed=2)["held_back"]
    listed = compat_scenarios.held_back_synsets(meta)
    assert listed == sorted(meta[int(keep[i])]["synset_id"] for i in held) and listed
    digest = compat_scenarios.held_back_digest(meta)
    with pytest.raises(SystemExit, match="not the frozen"):
        compat_scenarios.check_frozen_held_back(meta)  # the fixture is not the public nouns
    monkeypatch.setattr(compat_scenarios, "HELD_BACK_SHA256", digest)
    compat_scenarios.check_frozen_held_back(meta)
    monkeypatch.setattr(compat_scenarios, "HELD_BACK_SEED", compat_scenarios.HELD_BACK_SEED + 1)
    assert compat_scenarios.held_back_digest(meta) != digest
    # A --final run on data whose draw is not the frozen one stops before it trains anything.
    monkeypatch.setattr(compat_scenarios, "load_wordnet", lambda **_: SimpleNamespace(meta=meta))
    trained = []
    monkeypatch.setattr(compat, "run_seeds", lambda *a, **k: trained.append(a) or [])
    out = tmp_path / "final.json"
    with pytest.raises(SystemExit, match="not the frozen"):
        compat.main(["--final", "--scenarios", "external", "--no-markdown", "--out", str(out)])
    assert not trained and not out.exists()


def test_a_final_run_records_when_and_at_which_commit_each_scenario_looked(
    monkeypatch, tmp_path
) -> None:
    """Issue 42 item 3: every look at the held-back items is stated with its day and commit,
    per scenario (a merged table holds scenarios from separate runs); a run without --final
    records no look, and a scenario whose run recorded none is named as such."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.setattr(compat, "run_seeds", lambda *a, **k: [])
    monkeypatch.setattr(compat, "scenario_result", lambda sc, runs: {"scenario": {"name": sc.name}})
    base = ["--quick", "--querydoc", "skip", "--no-markdown", "--scenarios", "external,both"]
    days = {time.strftime("%Y-%m-%d")}
    final = json.loads(
        compat.main([*base, "--final", "--out", str(tmp_path / "f.json")]).read_text()
    )
    days.add(time.strftime("%Y-%m-%d"))  # a run across midnight records the day it started
    for sc in final["scenarios"]:
        assert sc["held_back_look"]["commit"] == head
        assert sc["held_back_look"]["date"] in days
    plain = json.loads(compat.main([*base, "--out", str(tmp_path / "p.json")]).read_text())
    assert all("held_back_look" not in sc for sc in plain["scenarios"])
    looked = {sc["scenario"]["name"]: sc for sc in final["scenarios"]}
    unlooked = {sc["scenario"]["name"]: sc for sc in plain["scenarios"]}
    lines = compat_report.look_lines([looked["external"], unlooked["both"]])
    assert lines[0].startswith("- external: held-back items looked at on ")
    assert f"`{head[:10]}`" in lines[0]
    assert lines[1] == "- both: its run recorded neither the day nor the commit."
    assert lines[-1] == "" and compat_report.look_lines([]) == []
    by_hand = {**looked["external"]["held_back_look"], "by_hand": "from its commit message"}
    (line, _) = compat_report.look_lines([{**looked["external"], "held_back_look": by_hand}])
    assert line.endswith(" (recorded by hand afterwards, from its commit message).")


def test_runs_under_different_held_back_draws_are_not_merged(tmp_path) -> None:
    """One table holds one held-back set: merging a run under another draw is refused."""
    quick = json.loads((REPO_ROOT / "bench/results/compat-quick.json").read_text())
    other = {**quick, "held_back": {**quick["held_back"], "seed": quick["held_back"]["seed"] + 1}}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, payload in zip(paths, (quick, other), strict=True):
        path.write_text(json.dumps(payload))
    with pytest.raises(SystemExit, match="different held-back draws"):
        compat_report.merge_runs(paths, tmp_path / "m.json", ["external"], markdown=False)
    assert not (tmp_path / "m.json").exists()


def test_old_head_items_follow_the_seed() -> None:
    splits = [compat_scenarios.load_split(quick=True, seed=seed) for seed in (0, 1)]
    halves = [compat_scenarios._old_training_items(s, "half-classes") for s in splits]
    classes = [set(np.unique(s.labels[h])) for s, h in zip(splits, halves, strict=True)]
    assert classes[0] != classes[1]
    assert np.intersect1d(halves[0], splits[0].held_back).size == 0


def test_no_old_head_sees_the_validation_items() -> None:
    """The evaluation items were never in an old head's training; validation must be alike, or
    it flatters every method that maps onto the old head (issue 26's head-scenario bias)."""
    for seed in (0, 1):
        split = compat_scenarios.load_split(quick=True, seed=seed)
        for mode in ("all", "half-items", "half-classes"):
            items = compat_scenarios._old_training_items(split, mode)
            assert items.size > 0
            assert np.intersect1d(items, split.validation).size == 0, mode
            assert np.intersect1d(items, split.evaluation).size == 0, mode
            assert np.setdiff1d(items, split.fit).size == 0, mode


def test_t_interval_is_the_student_interval_across_runs() -> None:
    values = [0.60, 0.64, 0.65]
    mean, low, high = t_interval(values)
    half = stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / math.sqrt(3)
    assert mean == pytest.approx(np.mean(values))
    assert (low, high) == pytest.approx((mean - half, mean + half))
    # One seed: a figure without an interval, never a met target.
    (line,) = [
        x
        for x in compat_report.target_lines(
            {
                "scenarios": [
                    {
                        **_scenario((0.75, 0.0, 0.96), 0.5),
                        "runs": _scenario((0.75, 0.0, 0.96), 0.5)["runs"][:1],
                    }
                ]
            }
        )
        if "P_com(CMC@1) 0.750" in x
    ]
    assert line.endswith("not met: one seed has no interval")


@pytest.fixture(scope="module")
def quick_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two seeds of the external scenario run as units (as the full run spreads them over
    processes), each seed its own split and selection, measured on the held-back items too
    (``--final``), then combined with the query→document part read from bench.quality.querydoc's
    file."""
    folder = tmp_path_factory.mktemp("compat")
    base = ["--quick", "--scenarios", "external"]
    # The methods in two halves, as the full run spreads them.
    halves = (
        "independent,hbct,l2,bct,contrastive",
        "procrustes,affine,mlp-adapter,instance-map,class-map",
    )
    units = []
    for seed in (0, 1):
        selects = []
        for i, half in enumerate(halves):
            out = folder / f"select-{seed}-{i}.json"
            argv = ["--unit", "select", "--seed", str(seed), "--methods", half, "--out", str(out)]
            selects.append(compat.main([*base, *argv]))
        units += selects
        out = folder / f"auto-{seed}.json"
        argv = ["--unit", "auto", "--seed", str(seed), "--final", "--out", str(out)]
        units.append(compat.main([*base, *argv]))
        for i, half in enumerate(halves):
            out = folder / f"methods-{seed}-{i}.json"
            argv = ["--unit", "methods", "--seed", str(seed), "--methods", half, "--final"]
            argv += ["--out", str(out), "--selection", *map(str, selects)]
            units.append(compat.main([*base, *argv]))
    out = folder / "quick.json"
    combine = ["--quick", "--combine", *map(str, units), "--querydoc", "reuse"]
    compat.main([*combine, "--no-markdown", "--out", str(out)])
    return json.loads(out.read_text())


def test_quick_run_measures_every_method_and_auto_in_both_views(quick_payload: dict) -> None:
    (sc,) = quick_payload["scenarios"]
    assert sc["scenario"]["name"] == "external" and len(sc["runs"]) == 2
    assert quick_payload["units"] == 10 and quick_payload["seeds"] == 2
    assert quick_payload["split_seeds"] == [0, 1]
    budget = compat.QUICK.trials + compat.QUICK.extend_rounds
    for run in sc["runs"]:
        trials = run["selection"]["trials"]
        # The same number of trials for every tuned method, widening included.
        assert {len(t) for m, t in trials.items() if m != "procrustes"} == {budget}
        assert len(trials["procrustes"]) == 1
        assert run["selection"]["edge"].keys() == compat_grid.GRIDS.keys()
        assert run["selection"]["instance_floor"] > 0
    # Each seed its own split: old→old itself differs between seeds.
    stay = [r["metrics"]["stay"]["class"]["cmc1"] for r in sc["runs"]]
    assert stay[0] != stay[1]
    for summary in (sc["summary"], sc["final_summary"]):
        rows = summary["rows"]
        for name in (*compat_grid.BRIDGES, "auto"):
            for key in ("instance.recall@1", "instance.recall@10", "instance.mrr@100"):
                assert 0.0 <= rows[name][key][0] <= 1.0, (name, key)
            assert rows[name]["p_com.cmc1"] is not None and rows[name]["p_up.cmc1"] is not None
            # The interval is Student's t over this row's per-seed figures, recomputed here (a
            # swapped, symmetric-by-construction or query-only interval fails).
            part = "metrics" if summary is sc["summary"] else "final_metrics"
            values = compat_report.per_seed(sc["runs"], name, "p_com.cmc1", part)
            mean, sd, low, high = rows[name]["p_com.cmc1"]
            assert len(values) >= 2, name
            assert (mean, low, high) == pytest.approx(t_interval(values)), name
            assert sd == pytest.approx(float(np.std(values, ddof=1)))
            assert high - low > 0 or np.ptp(values) == 0, name
        # Stay finds every item's own old vector first.
        assert rows["stay"]["instance.recall@1"][0] == 1.0
        assert set(summary["reference"]["cmc1"]) <= {"raw_new", "independent"}
    assert len(sc["summary"]["auto_chosen"]) == 2
    # The held-back items are the same for every seed, and external's old side is the raw
    # vectors: old→old on them does not move between seeds.
    assert sc["final_summary"]["rows"]["stay"]["class.cmc1"][1] == 0.0
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
    check_target_lines(
        compat_report.target_lines(quick_payload, part="final_metrics"),
        quick_payload,
        part="final_metrics",
    )
    # bench.quality.querydoc's own target lines, carried over as it words them, and what its
    # carried summary gives (its lines are checked against their figures in its own tests).
    carried = [f"- query → document, {line[2:]}" for line in qd["targets"]]
    assert len(qd["targets"]) == 5 and lines[len(ours) :] == carried
    text = compat_report.render_markdown(quick_payload)
    assert "| **auto** |" in text and "### query → document" in text
    assert "### external — held-back items" in text and "95 % interval" in text
    # The units put auto's part first; the table still lists it after every single method.
    lines = text.splitlines()
    first = {
        row: next(i for i, x in enumerate(lines) if x.startswith(row))
        for row in ("| **auto** |", "| class-map | ")
    }
    assert first["| **auto** |"] > first["| class-map | "]
    assert "own-item R@10" in text and "stronger:" in text


# The targets, restated here so that the lines are checked against the figures.
P_COM_TARGET, P_COM_MAP_TARGET, P_UP_FLOOR, INSTANCE_SHARE = 0.70, 0.60, -0.01, 0.95


def _low_end(values: list[float]) -> tuple[float, float]:
    """(mean, low end of the 95 % Student-t interval), computed here independently."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return mean, mean - half


def _expected_targets(
    payload: dict, part: str = "metrics"
) -> list[tuple[list[str], bool, float | None]]:
    """Per target line, in order: (figures the line must show, met, the margin a miss states);
    met only when the interval's low end clears the target."""
    out: list[tuple[list[str], bool, float | None]] = []

    def seeds(runs: list[dict], row: str, path: tuple[str, str]) -> list[float]:
        return [r[part][row][path[0]][path[1]] for r in runs if row in r[part]]

    def check(values: list[float], target: float, signed: bool = False) -> None:
        mean, low = _low_end(values)
        shown = f"{mean:+.3f}" if signed else f"{mean:.3f}"
        out.append(([shown], low >= target, target - low))

    for sc in payload["scenarios"]:
        runs = sc["runs"]
        own = seeds(runs, "auto", ("instance", "recall@1"))
        proc = seeds(runs, "procrustes", ("instance", "recall@1"))
        if own and len(own) == len(proc):
            check([a / p for a, p in zip(own, proc, strict=True)], INSTANCE_SHARE)
        if sc["scenario"]["name"] != "external":
            continue
        check(seeds(runs, "auto", ("p_com", "cmc1")), P_COM_TARGET)
        check(seeds(runs, "auto", ("p_com", "map@100")), P_COM_MAP_TARGET)
        check(seeds(runs, "auto", ("p_up", "cmc1")), P_UP_FLOOR, signed=True)
        auto = seeds(runs, "auto", ("p_com", "cmc1"))
        singles = {m: seeds(runs, m, ("p_com", "cmc1")) for m in compat_grid.BRIDGES}
        singles = {m: v for m, v in singles.items() if len(v) == len(runs)}
        kept = {
            m: v
            for m, v in singles.items()
            if all(
                r1 >= INSTANCE_SHARE * p
                for r1, p in zip(seeds(runs, m, ("instance", "recall@1")), proc, strict=True)
            )
        }
        for rivals in (singles, kept):
            if rivals:
                best = max(rivals, key=lambda m: np.mean(rivals[m]))
                diff = [a - b for a, b in zip(auto, rivals[best], strict=True)]
                mean, low = _low_end(diff)
                out.append(([best, f"{mean:+.3f}"], low >= 0, -low))
    if part == "metrics":
        for sc in payload["scenarios"]:
            edged = {m for r in sc["runs"] for m, e in r["selection"]["edge"].items() if e}
            out.append(([f"{len(edged)} of"] if edged else [], not edged, None))
    return out


def check_target_lines(lines: list[str], payload: dict, part: str = "metrics") -> None:
    """Each line shows its figures and states the verdict they give: "met", else "missed by"
    the gap of the interval's low end (or, for grid edges, "missed for" the number of methods
    on an edge)."""
    expected = _expected_targets(payload, part)
    assert len(lines) == len(expected), lines
    for line, (shown, met, margin) in zip(lines, expected, strict=True):
        if met:
            assert line.endswith(" — met"), line
        elif margin is None:
            assert " — missed for " in line and not line.endswith("met"), line
        else:
            assert line.endswith(f" — missed by {margin:.3f}"), (line, margin)
        assert all(figure in line for figure in shown), (line, shown)


def _metrics(p_com: float, p_up: float, own: float, best_single: float) -> dict:
    def bridge(pc: float, pu: float, r1: float) -> dict:
        return {
            "p_com": {"cmc1": pc, "map@100": pc},
            "p_up": {"cmc1": pu, "map@100": pu},
            "instance": {"recall@1": r1},
        }

    return {
        "auto": bridge(p_com, p_up, own),
        "procrustes": bridge(best_single, 0.0, 1.0),
        # Tuned for class alone: a higher P_com at half the own-item R@1.
        "class-map": bridge(0.9, 0.0, 0.5),
    }


def _scenario(auto: tuple[float, float, float], best_single: float, spread: float = 0.0) -> dict:
    """Three seeds around the given figures (± ``spread`` on auto's P_com)."""
    p_com, p_up, own = auto
    runs = [
        {
            "seed": seed,
            "metrics": _metrics(p_com + d, p_up, own, best_single),
            "selection": {"edge": {m: None for m in compat_grid.GRIDS}},
        }
        for seed, d in enumerate((-spread, 0.0, spread))
    ]
    return {"scenario": {"name": "external"}, "runs": runs}


def test_targets_say_met_or_by_how_much_they_are_missed() -> None:
    lines = compat_report.target_lines({"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]})
    assert len(lines) == 7
    assert "missed by 0.150" in lines[4]  # below class-map tuned for class alone (0.9)
    # Among the methods that keep the instance floor (procrustes, 0.5), auto is above.
    assert "keeps own-item R@1" in lines[5] and "best procrustes" in lines[5]
    met = lines[:4] + lines[5:]
    assert all(line.endswith("met") for line in met)
    short = compat_report.target_lines({"scenarios": [_scenario((0.65, -0.03, 0.90), 0.7)]})
    assert "missed by 0.050" in short[0]  # own-item R@1 0.90 = 0.90 × procrustes's
    assert "missed by 0.050" in short[1]  # P_com 0.65 < 0.70
    assert "missed by 0.020" in short[3]  # P_up −0.03 < −0.01
    assert "missed by 0.250" in short[4]  # below the best single method
    assert "missed by 0.050" in short[5]  # below procrustes, which keeps the floor
    sc = _scenario((0.75, 0.0, 0.96), 0.5)
    sc["runs"][1]["selection"]["edge"]["l2"] = "high"
    edge = compat_report.target_lines({"scenarios": [sc]})[-1]
    tuned = sum(1 for g in compat_grid.GRIDS.values() if g.axis)
    assert "l2 (1/3 seeds)" in edge and edge.endswith(f"missed for 1 of {tuned} tuned methods")


def test_a_mean_above_the_target_is_not_met_while_its_interval_crosses_it() -> None:
    # Mean P_com 0.75 over three seeds 0.65 / 0.75 / 0.85: its interval reaches below 0.70.
    (line,) = [
        x
        for x in compat_report.target_lines({"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5, 0.1)]})
        if "P_com(CMC@1) 0.750" in x
    ]
    _, low = _low_end([0.65, 0.75, 0.85])
    assert line.endswith(f"missed by {0.70 - low:.3f}") and "[95 %" in line
    assert compat_report.target_lines({"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]})[
        1
    ].endswith("met")


def test_the_target_check_follows_the_figures_and_fails_on_a_wrong_line() -> None:
    assert (compat_report.TARGET_P_COM, compat_report.P_UP_FLOOR) == (P_COM_TARGET, P_UP_FLOOR)
    assert compat_report.TARGET_P_COM_MAP == P_COM_MAP_TARGET
    assert compat_report.INSTANCE_FLOOR == INSTANCE_SHARE
    good = {"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]}
    short = {"scenarios": [_scenario((0.65, -0.03, 0.90), 0.7)]}
    wide = {"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5, 0.1)]}
    edged = {"scenarios": [_scenario((0.75, 0.0, 0.96), 0.5)]}
    edged["scenarios"][0]["runs"][0]["selection"]["edge"]["l2"] = "high"
    for payload in (good, short, wide, edged):
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
    with pytest.raises(AssertionError):  # the wide interval's miss reported as met
        check_target_lines(compat_report.target_lines(good), wide)


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
    mean, sd, low, high = compat_report.mean_sd([0.5, None, 0.7])  # type: ignore[misc]
    assert mean == pytest.approx(0.6) and sd == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert (low, high) == pytest.approx(t_interval([0.5, 0.7])[1:])
    assert compat_report.mean_sd([0.4]) == [0.4, 0.0, 0.4, 0.4]


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


def test_tune_gives_every_method_the_same_number_of_trials() -> None:
    grid = compat_grid.Grid("compat_weight", compat_grid.WEIGHTS)
    trained: list[float] = []

    def peaked_at(peak: float):
        def run_trial(settings: dict) -> dict:
            trained.append(settings["compat_weight"])
            return {"settings": settings, "score": -abs(np.log10(settings["compat_weight"] / peak))}

        return run_trial

    def score(trial: dict) -> float:
        return trial["score"]

    base = grid.settings(3)
    # A validation score peaking at 40, past the grid's high end: widened twice.
    trials, best, edge = compat_grid.tune(grid, base, {}, peaked_at(40), score, [], 2)
    assert trained == [0.1, 1.0, 10.0, 33.3, 111.0]
    assert trials[best]["settings"] == {"compat_weight": 33.3} and edge is None
    # Capped: one round leaves the best at the end it reached, and says so.
    trained.clear()
    trials, best, edge = compat_grid.tune(grid, base, {}, peaked_at(40), score, [], 1)
    assert trials[best]["settings"] == {"compat_weight": 33.3} and edge == "high"
    # A peak inside the grid: the extra trials refine between the best and its better
    # neighbour, so the trial count is the same as where widening was needed.
    trained.clear()
    trials, best, edge = compat_grid.tune(grid, base, {}, peaked_at(2.0), score, [], 2)
    assert trained == [0.1, 1.0, 10.0, 3.16, 1.78]
    assert trials[best]["settings"] == {"compat_weight": 1.78} and edge is None
    # An earlier selection's trials are taken, not retrained.
    earlier = [{"settings": {"compat_weight": 0.1}, "score": -99.0}]
    trained.clear()
    trials, _, _ = compat_grid.tune(grid, base, {}, peaked_at(40), score, earlier, 0)
    assert trained == [1.0, 10.0] and trials[0] is earlier[0]
    # Integer axes stop where nothing new lies between neighbours.
    ranks = compat_grid.Grid("adapter_rank", (1, 2))
    assert ranks.between(1, 2) is None and ranks.between(4, 16) == 8


def test_auto_edge_reads_the_tuned_axis_not_a_fixed_setting() -> None:
    # class-map-mlp's map_hidden is the same in every trial: the edge is class_weight's.
    tried = [{"map_hidden": 256, "class_weight": w} for w in (0.3, 1.0, 3.0, 10.0)]
    inside = {"auto": {"chosen_settings": tried[2], "tried": tried}}
    top = {"auto": {"chosen_settings": tried[3], "tried": tried}}
    untuned = {"auto": {"chosen_settings": {}, "tried": [{}]}}
    assert compat_report.auto_edges([inside, top, untuned]) == [None, "high", None]


def test_auto_row_states_its_trials_per_candidate() -> None:
    tried = [{"class_weight": w} for w in (0.3, 1.0, 3.0, 9.0, 27.0)]
    recorded = {"auto": {"trials": 3, "extra_trials": 2, "tried": tried[:4]}}
    assert compat_report.auto_trials_cell([recorded, recorded]) == "3 + 2 per candidate"
    # Runs from before the record: the most any seed's chosen candidate tried.
    older = [{"auto": {"trials": 3, "tried": tried[:4]}}, {"auto": {"trials": 3, "tried": [{}]}}]
    assert compat_report.auto_trials_cell(older) == "4 per candidate"


def test_the_section_says_how_autos_trials_were_trained_beside_the_single_methods() -> None:
    """Issue 42 item 2: auto screens its trials by successive halving unless its params turn it
    off, while the single methods train every trial in full; the section says which it was."""
    screened = compat_report.halving_text({})
    assert halving.RULE in screened and "more epochs than `auto`'s" in screened
    assert compat_report.halving_text({"halving": True}) == screened
    full = compat_report.halving_text({"halving": False})
    assert "full length, as the single methods' do" in full and halving.RULE not in full


def test_a_look_names_its_uncommitted_files_in_good_count() -> None:
    """Both held-back renderers (compat's and the continual benchmark's) state uncommitted
    files the same way: nothing for a clean tree, one file, several files."""
    assert uncommitted_phrase([]) == ""
    assert uncommitted_phrase(["app/a.py"]) == " with uncommitted changes to 1 file"
    assert uncommitted_phrase(["a", "b"]) == " with uncommitted changes to 2 files"
    recorded = json.loads((REPO_ROOT / "bench/results/continual.json").read_text())
    dirty = {**recorded, "source_state": {**recorded["source_state"], "app_changed": ["a"]}}
    assert continual_report.look_line(dirty).endswith(" with uncommitted changes to 1 file.")
    clean = {**recorded, "source_state": {**recorded["source_state"], "app_changed": []}}
    assert continual_report.look_line(clean).endswith("`.")
