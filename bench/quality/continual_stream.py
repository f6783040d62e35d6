"""The continual benchmark's public task streams: classification-style tasks (many glosses ↔ one
class-name text) alternating with retrieval tasks (lemma ↔ gloss, one to one), on WordNet nouns,
in two orders (``build_tasks``: ``interleaved`` and ``reordered``).

Two modalities, both embedded by one frozen encoder: ``text`` (a short name: the synset's own
lemmas in a retrieval task, its class ancestor's lemmas in a classification task) and ``gloss``
(the synset's definition). A class is a hypernym ancestor at depth ``CLASS_DEPTH`` of the
first-hypernym path (``ancestors`` in the metadata; its name text comes from the main rows or the
``ancestors.*`` files); classes with at least ``MIN_CLASS_ITEMS`` members are kept and dealt,
in a fixed shuffled order, into disjoint sets of ``CLASSES_PER_TASK``. Retrieval tasks take
lexicographer-file groups from the synsets that belong to no kept class, so no gloss appears in
two tasks. The stream's composition is fixed; the seed draws the items and the splits, so every
seed evaluates on a fresh random split.

A held-back final split (issue 26): ``HELD_BACK_FRACTION`` of every kept class's members and of
every retrieval group's rows, drawn once by the constant ``HELD_BACK_SEED`` (the same rows for
every seed and both stream orders), never enters any seed's train, test or validation rows.
``build_tasks(..., split=HELD_BACK)`` gives the same tasks with the same (seed's) training rows,
their test rows replaced by held-back rows, as many as a development test split holds.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from bench.common.wordnet import OLD_MODEL, WordNetData, load_wordnet

TEXT, GLOSS = "text", "gloss"
MODALITIES = (TEXT, GLOSS)  # text first: the name is the entailment apex
CLASSIFICATION, RETRIEVAL = "classification", "retrieval"
KINDS = (RETRIEVAL, CLASSIFICATION)

CLASS_DEPTH = 6
MIN_CLASS_ITEMS = 30
CLASSES_PER_TASK = 20
CLASSIFICATION_TASKS = 4
STREAM_SEED = 0  # the class deal: the same classes per task for every seed
RETRIEVAL_GROUPS: tuple[tuple[str, ...], ...] = (
    ("noun.artifact",),
    ("noun.person", "noun.group"),
    ("noun.act", "noun.event", "noun.communication", "noun.cognition"),
    ("noun.state", "noun.attribute", "noun.quantity", "noun.location", "noun.substance"),
)
INTERLEAVED, REORDERED = "interleaved", "reordered"
STREAMS = (INTERLEAVED, REORDERED)
TRAIN_FRACTION = 0.6
VALIDATION_FRACTION = 0.2  # of a task's training rows, for choosing settings
HELD_BACK_FRACTION = 0.2  # of every class's members and every retrieval group's rows
# Issue 42 item 3: a fresh draw of the held-back rows (the seed is the day it was drawn), replacing
# issue 26's seed 26, whose rows development runs had been scored on. ``HELD_BACK_SHA256`` freezes
# it: the SHA-256 of ``held_back_synsets`` on the public nouns, checked before a ``--final`` run.
HELD_BACK_SEED = 20261206
HELD_BACK_SHA256 = "08f2aed22503b5d9bcfdd4153eb97ca3f8437d6fe2c96d9b6c5375e8e94e5f02"
DEV, HELD_BACK = "dev", "held_back"
SPLITS = (DEV, HELD_BACK)


@dataclass
class Task:
    """One task. ``train``/``test`` hold paired rows per modality; in a classification task the
    ``text`` rows repeat the class name text, ``*_labels`` index ``class_names`` (the task's
    class texts, K×D) and accuracy is taken among these K classes. A retrieval task has
    ``train_labels`` None and no class names."""

    name: str
    kind: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    train_labels: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    class_names: np.ndarray | None = None

    @property
    def train_rows(self) -> int:
        return len(self.train[GLOSS])

    @property
    def test_rows(self) -> int:
        return len(self.test[GLOSS])

    @property
    def classes(self) -> int:
        return 0 if self.class_names is None else len(self.class_names)


@dataclass
class Corpus:
    """The WordNet-noun rows and the class-name rows, embedded by one encoder."""

    data: WordNetData
    ancestors: WordNetData
    encoder: str = OLD_MODEL

    @cached_property
    def name_rows(self) -> dict[str, tuple[WordNetData, int]]:
        """Synset id → (the rows holding it, its row); main rows win over ancestor rows."""
        out = {m["synset_id"]: (self.ancestors, i) for i, m in enumerate(self.ancestors.meta)}
        out.update({m["synset_id"]: (self.data, i) for i, m in enumerate(self.data.meta)})
        return out


def load_corpus(encoder: str = OLD_MODEL) -> Corpus:
    """Lemma and gloss features by ``encoder`` (``bench.perf.training`` also times the 768-d
    all-mpnet-base-v2), with the ancestor rows that name the classes."""
    data = load_wordnet(fields=("lemma", "gloss"), models=(encoder,))
    ancestors = load_wordnet(fields=("lemma",), models=(encoder,), prefix="ancestors.")
    return Corpus(data, ancestors, encoder)


def stream_classes(meta: list[dict], blocked: bool = False) -> list[list[str]]:
    """The class ids (ancestor synsets) of each classification task, disjoint, in stream order:
    the kept classes in a fixed shuffled order, dealt round-robin (task t takes every
    ``CLASSIFICATION_TASKS``-th from t) or, ``blocked``, in consecutive runs (the same classes,
    grouped into other tasks)."""
    counts = Counter(m["ancestors"][CLASS_DEPTH] for m in meta if len(m["ancestors"]) > CLASS_DEPTH)
    kept = sorted(c for c, n in counts.items() if n >= MIN_CLASS_ITEMS)
    needed = CLASSES_PER_TASK * CLASSIFICATION_TASKS
    if len(kept) < needed:
        raise ValueError(f"{len(kept)} classes with ≥ {MIN_CLASS_ITEMS} items; {needed} needed")
    order = np.random.default_rng(STREAM_SEED).permutation(len(kept))[:needed]
    dealt = [kept[i] for i in order]
    if blocked:
        return [
            dealt[t * CLASSES_PER_TASK : (t + 1) * CLASSES_PER_TASK]
            for t in range(CLASSIFICATION_TASKS)
        ]
    return [dealt[t::CLASSIFICATION_TASKS] for t in range(CLASSIFICATION_TASKS)]


def _class_text(corpus: Corpus, class_id: str) -> np.ndarray:
    """The lemma features of the class's synset (a main row, else an ancestor row)."""
    source, row = corpus.name_rows[class_id]
    return source.get("lemma", corpus.encoder)[row]


def _split(rows: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    chosen = rng.permutation(rows)
    cut = round(TRAIN_FRACTION * len(chosen))
    return chosen[:cut], chosen[cut:]


def _held_back(rows: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(development rows, held-back rows): ``HELD_BACK_FRACTION`` of ``rows`` by ``rng``."""
    chosen = rng.permutation(rows)
    cut = round(HELD_BACK_FRACTION * len(chosen))
    return np.sort(chosen[cut:]), chosen[:cut]


def _class_members(meta: list[dict], classes: list[str]) -> dict[str, list[int]]:
    """Class id → the rows whose ancestor at ``CLASS_DEPTH`` it is."""
    members: dict[str, list[int]] = {c: [] for c in classes}
    for i, m in enumerate(meta):
        if len(m["ancestors"]) > CLASS_DEPTH and m["ancestors"][CLASS_DEPTH] in members:
            members[m["ancestors"][CLASS_DEPTH]].append(i)
    return members


def _class_held_back(class_id: str, members: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A class's (development, held-back) rows. The draw is seeded by the class, so it does not
    depend on which task (stream order) the class falls in, nor on the seed."""
    rng = np.random.default_rng([HELD_BACK_SEED, *class_id.encode()])
    return _held_back(np.array(members), rng)


def _retrieval_pool(meta: list[dict], class_sets: list[list[str]]) -> np.ndarray:
    """The rows of no kept class: the retrieval tasks' synsets (the same for both orders)."""
    in_class = {c for cs in class_sets for c in cs}
    return np.array(
        [
            i
            for i, m in enumerate(meta)
            if not (len(m["ancestors"]) > CLASS_DEPTH and m["ancestors"][CLASS_DEPTH] in in_class)
        ]
    )


def _group_held_back(
    meta: list[dict], pool: np.ndarray, group: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """A retrieval group's (development, held-back) rows, seeded by the group."""
    in_group = np.array([i for i in pool if meta[i]["lexname"] in group])
    key = "+".join(group).encode()
    return _held_back(in_group, np.random.default_rng([HELD_BACK_SEED, *key]))


def held_back_synsets(meta: list[dict]) -> list[str]:
    """Every held-back row's synset id, sorted: the held-back share of every kept class and of
    every retrieval group (the same rows for every seed and both stream orders)."""
    class_sets = stream_classes(meta)
    members = _class_members(meta, [c for cs in class_sets for c in cs])
    rows = [_class_held_back(c, m)[1] for c, m in members.items()]
    pool = _retrieval_pool(meta, class_sets)
    rows += [_group_held_back(meta, pool, g)[1] for g in RETRIEVAL_GROUPS]
    return sorted(meta[int(i)]["synset_id"] for i in np.concatenate(rows))


def held_back_digest(meta: list[dict]) -> str:
    """SHA-256 of the held-back synset ids, one per line: what ``HELD_BACK_SHA256`` freezes."""
    return hashlib.sha256("\n".join(held_back_synsets(meta)).encode()).hexdigest()


def _test_share(limit: int) -> int:
    """How many rows a development test split takes out of ``limit`` drawn rows (0: all)."""
    return limit - round(TRAIN_FRACTION * limit) if limit else 0


def _classification_task(
    corpus: Corpus,
    name: str,
    classes: list[str],
    per_class: int,
    rng: np.random.Generator,
    split: str,
) -> Task:
    meta, enc = corpus.data.meta, corpus.encoder
    index = {c: k for k, c in enumerate(classes)}
    members = _class_members(meta, classes)
    parts = {c: _class_held_back(c, members[c]) for c in classes}
    # Up to ``per_class`` items of every class (0: all), so no class dominates the task.
    rows = np.concatenate([rng.permutation(parts[c][0])[: per_class or None] for c in classes])
    label_of = {i: index[meta[i]["ancestors"][CLASS_DEPTH]] for c in classes for i in members[c]}
    names = np.stack([_class_text(corpus, c) for c in classes])
    train, test = _split(rows, rng)
    if split == HELD_BACK:  # as many per class as a development test split takes
        test = np.concatenate([parts[c][1][: _test_share(per_class) or None] for c in classes])
    gloss = corpus.data.get("gloss", enc)

    def paired(part: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        labels = np.array([label_of[int(i)] for i in part])
        return {TEXT: names[labels], GLOSS: gloss[part]}, labels

    (train_f, train_l), (test_f, test_l) = paired(train), paired(test)
    return Task(name, CLASSIFICATION, train_f, test_f, train_l, test_l, names)


def _retrieval_task(
    corpus: Corpus,
    group: tuple[str, ...],
    pool: np.ndarray,
    items: int,
    rng: np.random.Generator,
    split: str,
) -> Task:
    dev, held_back = _group_held_back(corpus.data.meta, pool, group)
    rows = rng.permutation(dev)[: items or None]
    train, test = _split(rows, rng)
    if split == HELD_BACK:  # as many as a development test split holds
        test = held_back[: len(test)]
    enc = corpus.encoder
    lemma, gloss = corpus.data.get("lemma", enc), corpus.data.get("gloss", enc)
    return Task(
        "retrieval: " + "+".join(g.removeprefix("noun.") for g in group),
        RETRIEVAL,
        {TEXT: lemma[train], GLOSS: gloss[train]},
        {TEXT: lemma[test], GLOSS: gloss[test]},
    )


def build_tasks(
    corpus: Corpus,
    retrieval_items: int = 0,
    seed: int = 0,
    per_class: int = 0,
    stream: str = INTERLEAVED,
    split: str = DEV,
) -> list[Task]:
    """Classification tasks of ``CLASSES_PER_TASK`` disjoint classes (up to ``per_class`` items
    each; 0: all) alternating with retrieval tasks of up to ``retrieval_items`` synsets each
    (0: all), every task split 60/40 train/test by ``seed``. ``stream``:

    - ``interleaved``: C1 R1 C2 R2 … (classes dealt round-robin, retrieval groups in order);
    - ``reordered``: R4 C1′ R3 C2′ … — retrieval first, the retrieval groups in reverse order,
      and the same classes grouped into other tasks (dealt in consecutive runs).

    ``split``: ``dev`` (the development test rows) or ``held_back`` (the same training rows,
    tested on held-back rows that no development split of any seed holds).
    """
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}; expected one of {list(STREAMS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    rng = np.random.default_rng(seed)
    class_sets = stream_classes(corpus.data.meta, blocked=stream == REORDERED)
    pool = _retrieval_pool(corpus.data.meta, class_sets)
    groups = RETRIEVAL_GROUPS if stream == INTERLEAVED else RETRIEVAL_GROUPS[::-1]
    tasks = []
    for t, (classes, group) in enumerate(zip(class_sets, groups, strict=True)):
        pair = [
            _classification_task(corpus, f"classes {t + 1}", classes, per_class, rng, split),
            _retrieval_task(corpus, group, pool, retrieval_items, rng, split),
        ]
        tasks += pair if stream == INTERLEAVED else pair[::-1]
    return tasks


def carve_validation(task: Task, seed: int, fraction: float = VALIDATION_FRACTION) -> Task:
    """The task with ``fraction`` of its **training** rows held out as its test split: settings
    are chosen on these, never on the real test rows (which this task does not hold)."""
    rng = np.random.default_rng([seed, 7])
    perm = rng.permutation(task.train_rows)
    cut = round(fraction * len(perm))
    val, fit = perm[:cut], perm[cut:]
    labels = task.train_labels
    return replace(
        task,
        train={m: x[fit] for m, x in task.train.items()},
        test={m: x[val] for m, x in task.train.items()},
        train_labels=None if labels is None else labels[fit],
        test_labels=None if labels is None else labels[val],
    )
