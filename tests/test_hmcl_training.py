"""The continual trainer as the service calls it: models, state, rotations, reports, errors,
hooks — on the real WordNet fixture (two tasks: the fixture's lexnames split in two)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app.ml.hmcl import (
    METHODS,
    ContinualState,
    LorentzLinearHeads,
    TaskTrainer,
    contrastive_entailment_loss,
    map_query_to_ancestor,
    run_continual_task,
)
from app.ml.hmcl.metrics import drift_measures, paired_recall_at_k
from app.ml.methods.models import MODEL_KINDS, model_from_bytes, model_to_bytes
from app.ml.methods.training import TrainingCancelled, TrainingHooks

MINILM = "all-MiniLM-L6-v2"
MODALITIES = ("lemma", "gloss")
# A smaller head and no step minimum keep the tests fast.
FAST = {"epochs": 4, "batch_size": 256, "min_steps": 0, "dim": 128}


def _tasks(wordnet_small: dict) -> list[dict[str, np.ndarray]]:
    """Two tasks of real paired features: the fixture's lexnames, split in two halves."""
    lexnames = sorted(set(wordnet_small["lexname"]))
    halves = [set(lexnames[: len(lexnames) // 2]), set(lexnames[len(lexnames) // 2 :])]
    tasks = []
    for half in halves:
        rows = np.array([i for i, lex in enumerate(wordnet_small["lexname"]) if lex in half])
        tasks.append({m: wordnet_small[f"{m}.{MINILM}"][rows] for m in MODALITIES})
    return tasks


@pytest.fixture(scope="module")
def first_task(wordnet_small: dict):
    return run_continual_task("finetune", None, _tasks(wordnet_small)[0], params=FAST, seed=0)


def test_model_kind_embeds_space_components_and_round_trips(wordnet_small: dict) -> None:
    assert MODEL_KINDS["lorentz-linear-heads"] is LorentzLinearHeads
    model = LorentzLinearHeads({"lemma": 384, "gloss": 384}, 384, curv=0.1, lift_scale=1.0)
    model.init_identity()
    x = wordnet_small[f"gloss.{MINILM}"][:20]
    # Identity init: the head returns the lifted frozen features, exp₀(s·e/‖e‖).
    e = torch.from_numpy(x).double()
    unit = e / e.norm(dim=1, keepdim=True)
    expected = torch.sinh(torch.tensor(0.1) ** 0.5) / 0.1**0.5 * unit
    assert np.allclose(model.embed(x, "gloss"), expected.numpy(), atol=1e-5)
    restored = model_from_bytes(model_to_bytes(model))
    assert isinstance(restored, LorentzLinearHeads) and restored.modalities == MODALITIES
    assert np.array_equal(restored.embed(x, "gloss"), model.embed(x, "gloss"))
    with pytest.raises(KeyError, match="unknown modality"):
        model.embed(x, "image")
    with pytest.raises(ValueError, match="expected 384"):
        model.embed(x[:, :100], "gloss")


def test_first_task_learns_and_records_no_rotation(wordnet_small: dict, first_task) -> None:
    task = _tasks(wordnet_small)[0]
    assert np.array_equal(first_task.rotation, np.eye(128))
    assert first_task.report["loss_last"] < first_task.report["loss_first"]
    assert first_task.state.row_count == len(task["lemma"]) and first_task.state.tasks_seen == 1
    json.dumps(first_task.report)  # the service stores it as JSON
    # The model given back is the state's model.
    x = task["gloss"][:10]
    assert np.array_equal(
        first_task.model.embed(x, "gloss"), first_task.state.model().embed(x, "gloss")
    )


def test_state_round_trips_and_does_not_grow_with_tasks(wordnet_small: dict, first_task) -> None:
    blob = first_task.state.to_bytes()
    restored = ContinualState.from_bytes(blob)
    for name in MODALITIES:
        assert torch.equal(restored.second_moments[name], first_task.state.second_moments[name])
        assert torch.equal(restored.fisher[name], first_task.state.fisher[name])
    second = run_continual_task("hmcl-ca", restored, _tasks(wordnet_small)[1], params=FAST, seed=1)
    third = run_continual_task("ewc", second.state, _tasks(wordnet_small)[0], params=FAST, seed=2)
    assert abs(len(third.state.to_bytes()) - len(blob)) < 4096  # same tensors, same shapes
    assert third.state.tasks_seen == 3
    with pytest.raises(ValueError, match="continual state"):
        ContinualState.from_bytes(model_to_bytes(first_task.model))


def test_trainer_step_applies_the_admissible_correction(wordnet_small: dict, first_task) -> None:
    """One real CA step moves old protected outputs by Ω, the shared rotation; the epoch's
    anchoring then scales the displacement and the recorded Ω sum by (1 − β)."""
    task2 = _tasks(wordnet_small)[1]
    params = {**FAST, "energy": 0.8}
    trainer = TaskTrainer("hmcl-ca", first_task.state, task2, params=params, seed=0)
    geometry = trainer.geometry
    assert geometry is not None
    start = {k: v.double() for k, v in trainer.task_start.items()}
    trainer.train_step(torch.arange(trainer.rows)[:256])
    omega = trainer.generator_sum.dense()  # Ω after one step
    old = _tasks(wordnet_small)[0]
    for m in MODALITIES:
        z = trainer.model.lifted(torch.from_numpy(old[m]).double(), m)
        basis = geometry.bases[m].double()
        x_p = z[:, 1:] @ basis @ basis.T
        moved = x_p @ (trainer.model.heads[m].detach().double() - start[m])[:, 1:].T
        fitted = x_p @ geometry.least_squares_map(m).double()
        expected = fitted @ omega.T
        # float32 weights: agreement to float32 rounding of the weights, not 1e-6.
        assert float((moved - expected).abs().max()) < 1e-3 * float(expected.abs().max())
        assert float(expected.abs().max()) > 1e-4
    moved = {m: trainer.model.heads[m].detach().double() - start[m] for m in MODALITIES}
    trainer._anchor()
    beta = params.get("anchor", 0.1)
    assert torch.allclose(trainer.generator_sum.dense(), (1 - beta) * omega, atol=1e-12)
    for m in MODALITIES:
        after = trainer.model.heads[m].detach().double() - start[m]
        assert torch.allclose(after, (1 - beta) * moved[m], atol=1e-6)


def test_methods_keep_old_geometry_in_order(wordnet_small: dict, first_task) -> None:
    """On real data HMCL moves old embeddings (up to the recorded rotation) far less than
    fine-tuning; the report's residuals and the caller-supplied old task agree."""
    tasks = _tasks(wordnet_small)
    reports = {}
    for method in ("finetune", "hmcl-mr", "hmcl-ca"):
        result = run_continual_task(
            method,
            first_task.state,
            tasks[1],
            params={**FAST, "lr": 5e-3},
            seed=0,
            eval_tasks={"first": tasks[0]},
        )
        reports[method] = result.report
        json.dumps(result.report)
        assert np.allclose(result.rotation @ result.rotation.T, np.eye(128), atol=1e-8)
    drift = {m: r["eval_tasks"]["first"]["drift"] for m, r in reports.items()}
    for measure in ("radial", "angular", "cross_modal", "paired_distance"):
        assert drift["hmcl-mr"][measure] < 0.5 * drift["finetune"][measure]
        assert drift["hmcl-ca"][measure] < 0.5 * drift["finetune"][measure]
    ca = reports["hmcl-ca"]["old_rows_relative_residual"]
    assert ca["procrustes"] < ca["identity"]
    assert reports["hmcl-ca"]["params"]["rotation"] == "procrustes"
    assert reports["hmcl-mr"]["protected"]["lemma"]["rank"] >= 8


def test_rotation_compensation_serves_old_galleries(wordnet_small: dict, first_task) -> None:
    tasks = _tasks(wordnet_small)
    second = run_continual_task(
        "hmcl-ca", first_task.state, tasks[1], params={**FAST, "lr": 5e-3}, seed=0
    )
    gallery = first_task.model.embed(tasks[0]["gloss"], "gloss")  # built by version 1
    query = second.model.embed(tasks[0]["lemma"], "lemma")  # asked by version 2
    mapped = map_query_to_ancestor(query, [second.rotation])
    old_query = first_task.model.embed(tasks[0]["lemma"], "lemma")
    task_end = paired_recall_at_k(old_query, gallery, 0.1)
    # The recorded rotation brings new queries at least as close to the old ones as no mapping.
    assert np.abs(mapped - old_query).mean() <= np.abs(query - old_query).mean()
    assert paired_recall_at_k(mapped, gallery, 0.1) >= 0.9 * task_end


def test_ewc_penalty_holds_weights_near_the_parent(wordnet_small: dict, first_task) -> None:
    task2 = _tasks(wordnet_small)[1]
    moved = {}
    for lam in (0.0, 1e4):
        method = "ewc" if lam else "finetune"
        result = run_continual_task(
            method, first_task.state, task2, params={**FAST, "lr": 5e-3, "ewc_lambda": lam}
        )
        moved[lam] = sum(
            float((result.state.heads[m] - first_task.state.heads[m]).norm()) for m in MODALITIES
        )
    assert moved[1e4] < 0.5 * moved[0.0]


def test_hooks_report_every_epoch_and_cancel(wordnet_small: dict) -> None:
    task = _tasks(wordnet_small)[0]
    seen: list[dict] = []
    run_continual_task(
        "hmcl-ca",
        None,
        task,
        params={**FAST, "epochs": 3},
        hooks=TrainingHooks(progress=seen.append),
    )
    assert [p["epoch"] for p in seen] == [1, 2, 3] and all(p["epochs"] == 3 for p in seen)
    calls = {"n": 0}

    def stop_after_two() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    with pytest.raises(TrainingCancelled):
        run_continual_task(
            "finetune", None, task, params=FAST, hooks=TrainingHooks(should_stop=stop_after_two)
        )


@pytest.mark.parametrize(
    ("method", "params", "match"),
    [
        ("sgd", {}, "unknown method"),
        ("hmcl-ca", {"learning_rate": 1e-3}, "unknown parameter"),
        ("hmcl-ca", {"anchor": 1.0}, "anchor"),
        ("hmcl-ca", {"energy": 0.0}, "energy"),
        ("hmcl-ca", {"rotation": "polar"}, "rotation"),
        ("hmcl-ca", {"epochs": 2.5}, "integer"),
        ("hmcl-ca", {"lr": "fast"}, "number"),
        ("hmcl-ca", {"apex_modality": "image"}, "apex_modality"),
    ],
)
def test_bad_requests_are_value_errors(
    wordnet_small: dict, method: str, params: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        run_continual_task(method, None, _tasks(wordnet_small)[0], params=params)


def test_bad_features_are_value_errors(wordnet_small: dict, first_task) -> None:
    task = _tasks(wordnet_small)[1]
    with pytest.raises(ValueError, match="paired"):
        run_continual_task("finetune", None, {"lemma": task["lemma"], "gloss": task["gloss"][:-1]})
    with pytest.raises(ValueError, match="at least two modality"):
        run_continual_task("finetune", None, {"lemma": task["lemma"]})
    with pytest.raises(ValueError, match="finite"):
        bad = task["gloss"].copy()
        bad[0, 0] = np.nan
        run_continual_task("finetune", None, {"lemma": task["lemma"], "gloss": bad})
    with pytest.raises(ValueError, match="differ from the model"):
        run_continual_task(
            "finetune", first_task.state, {"lemma": task["lemma"], "text": task["gloss"]}
        )
    with pytest.raises(ValueError, match="curv is fixed"):
        run_continual_task("finetune", first_task.state, task, params={"curv": 1.0})
    with pytest.raises(ValueError, match="labels"):
        run_continual_task("finetune", None, task, labels=np.zeros(3))
    with pytest.raises(ValueError, match="eval task 'old'"):
        run_continual_task(
            "finetune", first_task.state, task, eval_tasks={"old": {"lemma": task["lemma"]}}
        )


def test_labels_keep_same_label_rows_from_being_negatives() -> None:
    g = torch.Generator().manual_seed(0)
    a = 0.3 * torch.randn(6, 4, generator=g)
    emb = {"lemma": a, "gloss": a.clone()}
    emb["gloss"][1] = emb["gloss"][0]  # rows 0 and 1 share a gloss: a false negative
    plain = contrastive_entailment_loss(emb, 0.1, 0.07, 0.0, "lemma")
    labels = torch.tensor([0, 0, 1, 2, 3, 4])
    masked = contrastive_entailment_loss(emb, 0.1, 0.07, 0.0, "lemma", labels)
    assert float(masked) < float(plain)
    # Entailment term: zero when every gloss lies in its lemma's cone, positive otherwise.
    inside = {"lemma": a, "gloss": 3.0 * a}
    outside = {"lemma": 3.0 * a, "gloss": a}
    assert float(contrastive_entailment_loss(inside, 0.1, 0.07, 1.0, "lemma")) < float(
        contrastive_entailment_loss(outside, 0.1, 0.07, 1.0, "lemma")
    )


def test_drift_measures_ignore_a_shared_rotation_and_see_a_stretch(wordnet_small: dict) -> None:
    model = LorentzLinearHeads({"lemma": 384, "gloss": 384}, 384)
    model.init_identity()
    emb = {
        m: model.embed(wordnet_small[f"{m}.{MINILM}"][:100], m).astype(np.float64)
        for m in MODALITIES
    }
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(384, 384)))
    rotated = {m: e @ q.T for m, e in emb.items()}
    assert max(drift_measures(emb, rotated, 0.1).values()) < 1e-10
    stretch = np.ones(384)
    stretch[:50] = 1.5
    stretched = {m: e * stretch for m, e in emb.items()}
    assert min(drift_measures(emb, stretched, 0.1).values()) > 1e-3
    assert set(drift_measures(emb, rotated, 0.1)) == {
        "radial",
        "angular",
        "cross_modal",
        "paired_distance",
    }


def test_all_methods_run(wordnet_small: dict, first_task) -> None:
    for method in METHODS:
        result = run_continual_task(
            method, first_task.state, _tasks(wordnet_small)[1], params={"epochs": 1, "min_steps": 0}
        )
        assert result.report["method"] == method and result.state.tasks_seen == 2


def test_modalities_from_different_encoders_and_any_order(wordnet_small: dict) -> None:
    """Heads of different input sizes (MPNet lemma 768, MiniLM gloss 384) share one output
    space; a later task may list the modalities in another order."""
    rows = slice(0, 200)
    task = {
        "lemma": wordnet_small["lemma.all-mpnet-base-v2"][rows],
        "gloss": wordnet_small[f"gloss.{MINILM}"][rows],
    }
    first = run_continual_task(
        "finetune", None, task, params={"epochs": 2, "min_steps": 0, "dim": 96}
    )
    assert first.model.input_dims == {"lemma": 768, "gloss": 384}
    assert first.model.embed(task["lemma"], "lemma").shape == (200, 96)
    swapped = {"gloss": task["gloss"], "lemma": task["lemma"]}
    second = run_continual_task(
        "hmcl-mr", first.state, swapped, params={"epochs": 2, "min_steps": 0}
    )
    assert second.model.modalities == ("lemma", "gloss")
