"""Map reports (trainer/report_html.py): the HTML itself, labels, the registry
round trip, the CLI and the service's /maps/<model> page.

The artifacts are made by hand for the real serving indices (COE, SCORE,
KNNSCAL), so the report is checked against the very ``maps`` the service
answers from; the headless-browser test is tests/test_report_browser.py.
"""

from __future__ import annotations

import re
import urllib.request
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordrec.service.indices.models.base import MapIndex, PointSet
from ordrec.service.storage.artifact import Artifact, ArtifactError
from ordrec.service.storage.format import read_view
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, run_cli
from ordrec.trainer.data.types import DataError
from ordrec.trainer.report_html import (
    DEFAULT_MAX_POINTS,
    LABELS_FILE,
    MISSING_COLOUR,
    PALETTE,
    REPORT_FILE,
    format_labels,
    map_views,
    parse_labels,
    read_labels,
    render_report,
    report_views,
    write_report,
)
from ordrec.trainer.reproduce.report import PaperFigure
from tests.conftest import data_file

VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "embed", "source", "wbr"}
# SVG elements our page may write self-closed (<rect/>) inside legend swatches.
SELF_CLOSED_OK = {"rect", "circle", "path"}


class Page(HTMLParser):
    """Checks tag balance and collects every map's marks with their hover text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.svgs: dict[str, dict] = {}
        self._svg: str | None = None
        self._mark: dict | None = None
        self._in_title = False
        self.body_attrs: dict = {}
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed: {self.stack}")

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body_attrs = attrs
        if tag == "svg" and "scatter" in attrs.get("class", ""):
            self._svg = attrs["id"]
            self.svgs[self._svg] = {"attrs": attrs, "marks": [], "labels": []}
        if self._svg and "pt" in attrs.get("class", "").split():
            self._mark = {"tag": tag, "attrs": attrs, "title": ""}
            self.svgs[self._svg]["marks"].append(self._mark)
        if self._svg and tag == "text":
            self.svgs[self._svg]["labels"].append(attrs)
        if tag == "title" and self._mark is not None:
            self._in_title = True
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        if tag not in VOID and tag not in SELF_CLOSED_OK:
            self.errors.append(f"unexpected self-closed <{tag}/>")

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "title":
            self._in_title = False
        if tag == "svg":
            self._svg = None
        if self._mark is not None and tag == self._mark["tag"]:
            self._mark = None

    def handle_data(self, data):
        if self._in_title and self._mark is not None:
            self._mark["title"] += data

    def marks(self, svg_id: str, entity: str | None = None) -> list[dict]:
        marks = self.svgs[svg_id]["marks"]
        return [m for m in marks if entity is None or f"e-{entity}" in m["attrs"]["class"].split()]


def parse(text: str) -> Page:
    page = Page(text)
    assert not page.errors, page.errors[:5]
    return page


def position(mark: dict) -> tuple[float, float]:
    a = mark["attrs"]
    if mark["tag"] == "circle":
        return float(a["cx"]), float(a["cy"])
    if mark["tag"] == "rect":
        return float(a["x"]) + float(a["width"]) / 2, float(a["y"]) + float(a["height"]) / 2
    return float(a["data-x"]), float(a["data-y"])


# ---------------------------------------------------------------- artifacts
def coe_artifact(n_users=30, n_items=20, seed=0, metrics=None, function="sigmoid") -> Artifact:
    rng = np.random.default_rng(seed)
    seen = [rng.choice(n_items, 3, replace=False) for _ in range(n_users)]
    indptr = np.zeros(n_users + 1, np.int64)
    indptr[1:] = np.cumsum([len(s) for s in seen])
    return Artifact(
        kind="coe",
        arrays={
            "user_coords": rng.normal(size=(n_users, 2)),
            "item_coords": rng.normal(size=(n_items, 2)),
            "seen_indptr": indptr,
            "seen_indices": np.concatenate(seen).astype(np.int32),
            "item_popularity": np.ones(n_items, np.float32),
        },
        ids={
            "users": IdMap([str(u + 1) for u in range(n_users)]),
            "items": IdMap([str(i + 1) for i in range(n_items)]),
        },
        hyperparameters={"dim": 2, "function": function},
        metrics=dict(metrics or {}),
    )


def score_artifact(n_objects=24, seed=0, mode="multi", with_labels=True) -> Artifact:
    pytest.importorskip("ordrec.service.indices.models.score")
    rng = np.random.default_rng(seed)
    aspects = ["legs", "type", "colour"]
    values = {"legs": ["0", "2", "4"], "type": ["bird", "fish"], "colour": ["red", "green", "blue", "grey"]}
    codes = np.stack([rng.integers(0, len(values[a]), n_objects) for a in aspects], axis=1).astype(np.int32)
    codes[0, 2] = -1  # a missing value
    y = rng.normal(size=(1, n_objects, 3))
    x = rng.normal(size=(len(aspects), 3))
    attributes = {"mode": mode, "values": values}
    if with_labels:
        attributes["object_labels"] = [f"animal {o}" for o in range(n_objects)]
    return Artifact(
        kind="score",
        arrays={
            "object_points": y / np.linalg.norm(y, axis=2, keepdims=True),
            "aspect_points": x / np.linalg.norm(x, axis=1, keepdims=True),
            "aspect_object_set": np.zeros(len(aspects), np.int32),
            "deltas": np.full(len(aspects), 0.5),
            "codes": codes,
        },
        ids={"objects": IdMap([f"o{o:03d}" for o in range(n_objects)]), "aspects": IdMap(aspects)},
        hyperparameters={"mode": mode},
        attributes=attributes,
    )


def knnscal_artifact(n=40, seed=0) -> Artifact:
    pytest.importorskip("ordrec.service.indices.models.knnscal")
    rng = np.random.default_rng(seed)
    return Artifact(
        kind="knnscal",
        arrays={
            "coordinates": rng.normal(size=(n, 2)),
            "labels": np.arange(n, dtype=np.int64) % 3,
            "rank_disparity": np.linspace(0.0, 2.0, 6),
        },
        ids={"objects": IdMap([f"v{v:03d}" for v in range(n)])},
        metrics={"stress": 0.01, "order_agreement": 0.9},
    )


class ToyIndex(MapIndex):
    """A generic single-map index over an artifact's ``coords`` (any dimension)."""

    kind = "toy"
    default_entity = "objects"

    def __init__(self, artifact: Artifact):
        super().__init__(artifact)
        self.maps[""] = {"objects": PointSet(artifact.idmap("objects"), artifact.array("coords"))}


def toy_artifact(coords: np.ndarray) -> Artifact:
    return Artifact(
        kind="toy", arrays={"coords": coords}, ids={"objects": IdMap([f"p{k}" for k in range(len(coords))])}
    )


# -------------------------------------------------------------------- tests
def test_coe_page_is_well_formed_and_draws_every_user_and_item_with_its_mark():
    artifact = coe_artifact(n_users=30, n_items=20)
    page = parse(render_report(artifact))
    assert list(page.svgs) == ["map-1"]
    svg = page.svgs["map-1"]
    assert svg["attrs"]["data-points"] == "50"
    users, items = page.marks("map-1", "users"), page.marks("map-1", "items")
    assert len(users) == 30 and {m["tag"] for m in users} == {"circle"}
    assert len(items) == 20 and {m["tag"] for m in items} == {"rect"}
    assert len({m["attrs"]["fill"] for m in users} | {m["attrs"]["fill"] for m in items}) == 2
    # every mark has a hover label naming its kind and id, and each id appears once
    assert sorted(m["title"] for m in users) == sorted(f"user {u}" for u in artifact.ids["users"].ids)
    assert sorted(m["title"] for m in items) == sorted(f"item {i}" for i in artifact.ids["items"].ids)


def test_drawn_positions_are_the_index_coordinates_on_one_scale_with_y_up():
    artifact = coe_artifact(n_users=25, n_items=15, seed=3)
    page = parse(render_report(artifact))
    data = np.concatenate([artifact.arrays["user_coords"], artifact.arrays["item_coords"]])
    marks = page.marks("map-1", "users") + page.marks("map-1", "items")
    screen = np.array([position(m) for m in marks])
    screen[:, 1] = -screen[:, 1]  # SVG y grows downwards; the map's grows upwards
    # one similarity (scale + translation, no rotation or reflection) maps data to screen
    scale = np.linalg.norm(screen[1:] - screen[0], axis=1) / np.linalg.norm(data[1:] - data[0], axis=1)
    assert np.allclose(scale, scale[0], rtol=2e-3)
    shift = screen - scale[0] * data
    assert np.allclose(shift, shift[0], atol=0.02)


def test_labels_apply_to_items_and_are_escaped():
    artifact = coe_artifact(n_users=5, n_items=4)
    labels = {"1": "Toy Story (1995)", "2": "<script>alert(1)</script> & co", "1000": "not on the map"}
    text = render_report(artifact, labels=labels)
    page = parse(text)
    titles = {m["title"] for m in page.marks("map-1", "items")}
    assert "Toy Story (1995) (item 1)" in titles
    assert "<script>alert(1)</script> & co (item 2)" in titles  # the parser unescaped it
    assert "<script>alert(1)" not in text
    # user "1" shares the id but is not relabelled: labels are for the map's main entity
    assert "user 1" in {m["title"] for m in page.marks("map-1", "users")}


def test_page_references_no_url_and_needs_no_network():
    text = render_report(coe_artifact()) + render_report(knnscal_artifact())
    assert not re.search(r"https?:|ftp:|//[a-z0-9]", text, re.I)
    for attr in re.findall(r'(?:src|href)="([^"]*)"', text):
        assert attr.startswith("data:"), attr
    assert '<link rel="stylesheet"' not in text and "@import" not in text and "url(" not in text
    assert "<script src" not in text


def test_score_has_one_map_per_aspect_coloured_by_value_and_the_sphere():
    artifact = score_artifact(n_objects=24)
    from ordrec.service.indices.models.score import SCOREIndex

    index = SCOREIndex.from_artifact(artifact)
    page = parse(render_report(artifact, index))
    aspects = artifact.ids["aspects"].ids
    assert len(page.svgs) == len(aspects) + 1  # one per aspect, then the sphere
    codes = artifact.arrays["codes"]
    objects = artifact.ids["objects"].ids
    for t, aspect in enumerate(aspects):
        marks = page.marks(f"map-{t + 1}", "objects")
        assert len(marks) == len(objects)
        values = artifact.attributes["values"][aspect]
        by_row = {int(re.search(r"object o(\d+)", m["title"]).group(1)): m for m in marks}
        colour_of_value: dict[int, str] = {}
        for row, mark in by_row.items():
            code = int(codes[row, t])
            fill = mark["attrs"]["fill"]
            if code < 0:
                assert fill == MISSING_COLOUR and mark["title"].endswith(f"{aspect} = missing")
                continue
            assert mark["title"].endswith(f"{aspect} = {values[code]}")
            assert colour_of_value.setdefault(code, fill) == fill  # one colour per value
        assert len(set(colour_of_value.values())) == len(colour_of_value)  # distinct per value
        assert set(colour_of_value.values()) <= set(PALETTE)
        # the aspect map is the index's map, as the service answers from it
        drawn = np.array([position(by_row[r]) for r in sorted(by_row)])
        coords = index.maps[aspect]["objects"].coords
        d_screen = np.linalg.norm(drawn[:, None] - drawn[None], axis=2)
        d_map = np.linalg.norm(coords[:, None] - coords[None], axis=2)
        ratio = d_screen[d_map > 1e-9] / d_map[d_map > 1e-9]
        assert np.allclose(ratio, ratio[0], rtol=5e-3)
    sphere = f"map-{len(aspects) + 1}"
    assert len(page.marks(sphere, "objects")) == len(objects)
    diamonds = page.marks(sphere, "aspects")
    assert len(diamonds) == len(aspects) and {m["tag"] for m in diamonds} == {"path"}
    assert len(page.svgs[sphere]["labels"]) == len(aspects)  # aspect names written on the sphere
    text = render_report(artifact, index)
    assert "PCA projection of the 3-D coordinates" in text
    assert "animal 5 (object o005)" in text  # SCORE's object labels


def test_knnscal_colours_by_class_and_reports_metrics_without_paper_figures():
    artifact = knnscal_artifact(n=40)
    text = render_report(artifact)
    page = parse(text)
    marks = page.marks("map-1", "objects")
    assert len(marks) == 40
    fills = {}
    for m in marks:
        row = int(re.search(r"object v(\d+)", m["title"]).group(1))
        fills.setdefault(row % 3, set()).add(m["attrs"]["fill"])
    assert all(len(f) == 1 for f in fills.values()) and len(set.union(*fills.values())) == 3
    assert "<td>stress</td><td>0.01</td><td>–</td>" in text
    assert "<td>order_agreement</td><td>90.0 %</td>" in text
    assert "Table" not in text


def test_coe_metrics_sit_beside_table_3_for_the_versions_function():
    metrics = {"preservation_h": 0.7012, "prediction_h": 0.6213, "knn1_h": 4.2}
    text = render_report(coe_artifact(metrics=metrics))
    assert "<td>preservation_h</td><td>70.1 %</td><td>69.6 %</td>" in text
    assert "<td>knn1_h</td><td>4.2</td><td>4.19</td>" in text
    assert "<td>prediction_a</td><td>not recorded</td><td>64.0 %</td>" in text
    assert "COE-S, data=ML-100K" in text
    gompertz = render_report(coe_artifact(metrics=metrics, function="gompertz"))
    assert "COE-G, data=ML-100K" in gompertz and "<td>knn1_h</td><td>4.2</td><td>4.15</td>" in gompertz
    own = render_report(
        coe_artifact(metrics={"auc": 0.5}), paper=[PaperFigure("X", {"data": "d"}, "auc", 0.75, "Table 9")]
    )
    assert "<td>auc</td><td>0.5</td><td>0.75</td>" in own and "Table 9" in own and "Table 3" not in own


def test_score_paper_figure_follows_the_mode():
    multi = render_report(score_artifact(mode="multi"))
    assert "SCORE (multi-map)" in multi and "98.0 %" in multi and "89.0 %" in multi
    single = render_report(score_artifact(mode="single"))
    assert "single map" in single and "82.0 %" in single and "70.0 %" in single


def test_large_maps_are_capped_by_a_deterministic_sample_and_the_page_says_so():
    rng = np.random.default_rng(1)
    artifact = toy_artifact(rng.normal(size=(12_000, 2)))
    text = render_report(artifact, ToyIndex(artifact))
    page = parse(text)
    marks = page.marks("map-1")
    assert len(marks) == DEFAULT_MAX_POINTS == int(page.svgs["map-1"]["attrs"]["data-points"])
    assert "5,000 of 12,000 objects (a deterministic random sample" in text
    assert render_report(artifact, ToyIndex(artifact)) == text  # same sample every time
    rows = sorted(int(m["title"].split("object p")[1]) for m in marks)
    assert len(set(rows)) == len(rows) and rows[0] < 100 and rows[-1] > 11_900  # spread over all rows


def test_cap_keeps_small_entities_whole():
    """Users (few) are all drawn; items (many) take the rest of the cap."""
    artifact = coe_artifact(n_users=40, n_items=3000)
    views = map_views(
        artifact,
        __import__("ordrec.service.indices.models.coe", fromlist=["COEIndex"]).COEIndex(artifact),
        max_points=1000,
    )
    drawn = {layer.entity: len(layer.rows) for layer in views[0].layers}
    assert drawn == {"users": 40, "items": 960}


def test_three_d_map_is_projected_by_pca_preserving_a_planar_configuration():
    rng = np.random.default_rng(2)
    plane = rng.normal(size=(60, 2)) * [3.0, 1.0]
    basis = np.linalg.qr(rng.normal(size=(3, 3)))[0][:, :2]
    coords = plane @ basis.T + [5.0, -2.0, 1.0]  # a tilted, shifted plane in 3-D
    artifact = toy_artifact(coords)
    text = render_report(artifact, ToyIndex(artifact))
    assert "PCA projection of the 3-D coordinates" in text and "(100.0 % of the variance)" in text
    drawn = np.array([position(m) for m in parse(text).marks("map-1")])
    d_screen = np.linalg.norm(drawn[:, None] - drawn[None], axis=2)
    d_data = np.linalg.norm(coords[:, None] - coords[None], axis=2)
    off = d_data > 1e-9
    ratio = d_screen[off] / d_data[off]
    assert np.allclose(ratio, ratio[0], rtol=5e-3)


def test_non_map_models_are_refused():
    class NotAMap:
        maps = {}

    with pytest.raises(ValueError, match="not a map model"):
        render_report(coe_artifact(), index=NotAMap())


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 60),
    dim=st.integers(1, 4),
    cap=st.integers(1, 80),
    spread=st.sampled_from([0.0, 1e-9, 1.0, 1e6]),
    names=st.lists(st.text(min_size=1, max_size=12), min_size=60, max_size=60),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_map_gives_a_well_formed_page_with_the_capped_count(n, dim, cap, spread, names, seed):
    coords = np.random.default_rng(seed).normal(size=(n, dim)) * spread + 3.0
    artifact = toy_artifact(coords)
    labels = {f"p{k}": names[k] for k in range(n)}
    text = render_report(artifact, ToyIndex(artifact), labels=labels, max_points=cap)
    page = parse(text)
    marks = page.marks("map-1")
    assert len(marks) == min(n, cap) == int(page.svgs["map-1"]["attrs"]["data-points"])
    for mark in marks:
        x, y = position(mark)
        assert 0 <= x <= 560 and 0 <= y <= 440  # finite and inside the plot box
        row = (
            int(mark["title"].rsplit("(object p", 1)[-1].rstrip(")"))
            if "(object p" in mark["title"]
            else int(mark["title"].rsplit("object p", 1)[-1])
        )
        assert mark["title"].startswith(labels[f"p{row}"]) or labels[f"p{row}"] == f"p{row}"
    assert not re.search(r"(?:src|href)=\"(?!data:)", text)


# ------------------------------------------------------------------ labels
def test_read_labels_formats(tmp_path):
    item = tmp_path / "u.item"
    item.write_bytes(
        "1|Toy Story (1995)|01-Jan-1995||http://x|0|0\n"
        "543|Misérables, Les (1995)|01-Jan-1995||http://y|0|1\n".encode("latin-1")
    )
    assert read_labels(item) == {"1": "Toy Story (1995)", "543": "Misérables, Les (1995)"}
    tsv = tmp_path / "labels.tsv"
    tsv.write_text("# comment\n\nv1\tfirst one\textra\nv2\tsecond\n", encoding="utf-8")
    assert read_labels(tsv) == {"v1": "first one", "v2": "second"}
    dat = tmp_path / "movies.dat"
    dat.write_text("1::Toy Story (1995)::Animation|Children's\n", encoding="utf-8")
    assert read_labels(dat) == {"1": "Toy Story (1995)"}


def test_read_labels_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1|one\njust text\n")
    with pytest.raises(DataError, match=r"bad.txt:2"):
        read_labels(bad)
    dup = tmp_path / "dup.txt"
    dup.write_text("1|one\n1|uno\n")
    with pytest.raises(DataError, match=r"dup.txt:2.*already"):
        read_labels(dup)


def test_format_labels_round_trips(tmp_path):
    labels = {"1": "Toy Story (1995)", "x|y": "a | b", "é": "tab\tinside", "3": "Misérables"}
    path = tmp_path / "l.tsv"
    path.write_bytes(format_labels(labels))
    assert read_labels(path) == {**labels, "é": "tab inside"}


# -------------------------------------------------------- registry and CLI
def test_publish_with_views_then_write_report_keeps_labels(tmp_path):
    registry = Registry(tmp_path / "reg")
    artifact = coe_artifact()
    labels = {"1": "Toy Story (1995)"}
    # a callable view is drawn with the version's name, version and created_at set
    version = registry.publish("films", artifact, views=lambda a: report_views(a, labels))
    folder = tmp_path / "reg" / "films" / version
    first = read_view(folder, REPORT_FILE).decode("utf-8")
    assert f"version <b>{version}</b>" in first and f"created {artifact.created_at}" in first
    assert "model <b>films</b>" in first and "Toy Story (1995) (item 1)" in first
    assert parse_labels(read_view(folder, LABELS_FILE), "labels") == labels
    # regenerating (default: the live version) reuses the labels kept beside the report,
    # and repairs a damaged report
    damaged = registry.load("films").views[REPORT_FILE]
    (folder / damaged.path).write_text("stale")
    with pytest.raises(ArtifactError, match="checksum"):
        registry.load("films")
    path = write_report(registry, "films")
    assert path.parent == folder / "views" and path.name.endswith(REPORT_FILE)
    again = path.read_text(encoding="utf-8")
    assert again == read_view(folder, REPORT_FILE).decode("utf-8")
    assert "Toy Story (1995) (item 1)" in again and artifact.created_at in again
    # a new labels file replaces the kept one
    new = tmp_path / "u.item"
    new.write_bytes("1|Jumanji (1995)|x\n".encode("latin-1"))
    path = write_report(str(tmp_path / "reg"), "films", version, labels_path=new)
    assert "Jumanji (1995) (item 1)" in path.read_text(encoding="utf-8")
    assert parse_labels(read_view(folder, LABELS_FILE), "labels") == {"1": "Jumanji (1995)"}
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left
    assert registry.load("films", version).kind == "coe"  # the version still verifies


def test_cli_report_rewrites_the_live_version(tmp_path):
    registry = Registry(tmp_path / "reg")
    registry.publish("kn", knnscal_artifact())
    version, _ = registry.live_version("kn")
    out = run_cli(["ordrec.trainer", "report", "--registry", str(tmp_path / "reg"), "--model", "kn"])
    path = tmp_path / "reg" / "kn" / version / registry.load("kn").views[REPORT_FILE].path
    assert out.stdout.strip() == str(path)
    assert parse(path.read_text(encoding="utf-8")).svgs["map-1"]["attrs"]["data-points"] == "40"


def test_service_serves_the_live_versions_report(tmp_path):
    registry = Registry(tmp_path / "reg")
    artifact = coe_artifact()
    registry.publish("films", artifact, views=report_views(artifact))  # a plain mapping works too
    expected = read_view(artifact.path, REPORT_FILE)
    with ServerProcess(tmp_path / "reg") as server:
        with urllib.request.urlopen(f"{server.metrics_url}/maps/films", timeout=10) as reply:
            assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/html")
            assert reply.read() == expected
        with urllib.request.urlopen(f"{server.metrics_url}/maps/", timeout=10) as reply:
            assert b'href="/maps/films"' in reply.read()


@pytest.mark.slow
def test_read_labels_on_movielens_u_item():

    path = data_file("ml-100k", "u.item")
    labels = read_labels(path)
    assert len(labels) == 1682 and labels["1"] == "Toy Story (1995)"
    assert labels["543"] == "Misérables, Les (1995)"  # latin-1, as the data README says
    artifact = coe_artifact(n_users=5, n_items=600)
    titles = {m["title"] for m in parse(render_report(artifact, labels=labels)).marks("map-1", "items")}
    assert "Misérables, Les (1995) (item 543)" in titles
