"""Visual map reports: one self-contained HTML page per map-model version.

COE (users and items on one map), SCORE (one 2-D map per aspect, plus the
sphere) and KNNSCAL (one map of objects) exist to be looked at (COE Figure 4,
SCORE Figure 7). :func:`render_report` draws every map of a version as an SVG
scatter plot, zoomable (mouse wheel) and pannable (drag) with a few lines of
plain JavaScript, labels on hover, and the version's metrics beside the
paper's figures. The page needs no network: CSS, JavaScript and SVG are
inline, and it references no URL at all.

The coordinates come from the serving index (``index.maps[space][entity]``,
:class:`service.indices.models.base.MapIndex`), built from the artifact exactly as
the service builds it, so the picture shows the map that answers
``Neighbors`` and ``Coordinates`` queries.

:func:`write_report` (re)writes ``report.html`` into a published version's
folder (``ordrec-train report``); :func:`report_views` gives the same bytes
to ``Registry.publish(..., views=...)`` so a version and its report appear in
one atomic rename. The service serves the live version's report at
``/maps/<model>`` on its metrics port.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ordrec.service.indices.models import index_class, kinds
from ordrec.service.indices.models.base import MapIndex
from ordrec.service.storage.artifact import Artifact, View
from ordrec.service.storage.format import read_view, write_views
from ordrec.service.storage.registry import Registry
from ordrec.trainer.data.types import DataError
from ordrec.trainer.reproduce.report import PaperFigure

REPORT_FILE = "report.html"
LABELS_FILE = "labels.tsv"
DEFAULT_MAX_POINTS = 5000
SAMPLE_SEED = 0  # the drawn subset of a large map is the same on every render

# Plot box in SVG user units; the SVG scales to the page width.
WIDTH, HEIGHT, PAD = 560.0, 440.0, 18.0
MARK_SIZE = 4.0  # radius of a circle / half side of a square, in SVG units

# Tableau 10: distinguishable, colour-blind friendlier than the default cycles.
PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
]
MISSING_COLOUR = "#c8c8c8"
ENTITY_STYLE = {  # mark and colour when a map is not coloured by a value
    "users": ("circle", "#4e79a7"),
    "items": ("square", "#e15759"),
    "objects": ("circle", "#4e79a7"),
    "aspects": ("diamond", "#222222"),
}
ENTITY_NOUN = {"users": "user", "items": "item", "objects": "object", "aspects": "aspect"}
# Entities with at most this many drawn points get their label written beside the mark.
TEXT_LABEL_LIMIT = 40

# Metrics that are fractions in [0, 1]; the papers print them as percentages.
_ACCURACY_PREFIXES = (
    "preservation",
    "prediction",
    "order_agreement",
    "recall",
    "knn_accuracy",
    "trustworthiness",
)


# ------------------------------------------------------------ paper figures
def paper_figures(
    kind: str, hyperparameters: Mapping | None = None, attributes: Mapping | None = None
) -> list[PaperFigure]:
    """The paper's figures that a version of ``kind`` can be put beside: its
    protocol's ``map_paper_figures`` (KNNSCAL's poster reports no table).
    Accuracies are fractions, as our metrics are."""
    if kind not in kinds.names():  # a map drawn from a hand-made index
        return []
    figures = getattr(kinds.get(kind).protocol_module(), "map_paper_figures", None)
    return figures(hyperparameters or {}, attributes or {}) if figures else []


# -------------------------------------------------------------------- labels
def read_labels(path: str | os.PathLike) -> dict[str, str]:
    """Display labels of ids from a text file.

    Accepted lines (one id per line; blank lines and ``#`` comments skipped):

    - MovieLens ``u.item``: ``id|title|...`` (the file is latin-1);
    - MovieLens 1M ``movies.dat``: ``id::title::genres``;
    - ``id<TAB>label[<TAB>...]`` (e.g. Last.fm ``artists.dat``) or ``id|label``.

    UTF-8 is tried first and latin-1 is the fallback, since latin-1 decodes
    any byte string (MovieLens 100K's titles are latin-1). Raises
    :class:`DataError` naming the file and line for a line without a
    separator, an empty id, or an id given two different labels.
    """
    return parse_labels(Path(path).read_bytes(), path)


def parse_labels(raw: bytes, path: str | os.PathLike) -> dict[str, str]:
    """:func:`read_labels` on bytes already read (``path`` names them in errors)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    labels: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if "\t" in line:
            fields = line.split("\t")
        elif "::" in line:
            fields = line.split("::")
        elif "|" in line:
            fields = line.split("|")
        else:
            raise DataError(path, number, "expected 'id<TAB>label', 'id|label' or 'id::label'")
        external, label = fields[0].strip(), fields[1].strip()
        if not external:
            raise DataError(path, number, "empty id")
        if labels.get(external, label) != label:
            raise DataError(path, number, f"id {external!r} already has the label {labels[external]!r}")
        labels[external] = label or external
    return labels


def format_labels(labels: Mapping[str, str]) -> bytes:
    """``id<TAB>label`` lines that :func:`read_labels` reads back unchanged."""
    lines = []
    for external, label in labels.items():
        clean = " ".join(str(label).split())  # no tab or line break inside a label
        if "\t" in external or "\n" in external or "\r" in external:
            continue
        lines.append(f"{external}\t{clean}\n")
    return "".join(lines).encode("utf-8")


# ---------------------------------------------------------- map extraction
@dataclass
class Layer:
    """The drawn points of one entity kind on one map."""

    entity: str
    mark: str  # "circle" | "square" | "diamond"
    rows: np.ndarray  # drawn rows of the entity's id map (sorted)
    total: int  # points of this entity on the map
    xy: np.ndarray = field(default_factory=lambda: np.empty((0, 2)))  # projected data coordinates
    hover: list[str] = field(default_factory=list)
    colours: list[str] = field(default_factory=list)
    text: list[str] | None = None  # labels written beside the marks (small entity sets)


@dataclass
class MapView:
    space: str
    title: str
    dim: int
    projection: str
    layers: list[Layer]
    legend: list[tuple[str, str, str, int]]  # (mark, colour, text, count)
    colour_note: str = ""


def _projection(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(centre, (dim, 2) axes, description) of the 2-D view of a map.

    2-D maps are drawn as they are. Higher dimensions are projected onto the
    first two principal axes of all the map's points (PCA), with each axis'
    sign fixed so the largest loading is positive (a deterministic picture);
    the page states the share of variance the two axes keep.
    """
    dim = coords.shape[1]
    if dim == 2:
        return np.zeros(2), np.eye(2), "the 2-D map coordinates as they are"
    if dim == 1:
        return np.zeros(1), np.array([[1.0, 0.0]]), "a 1-D map: the coordinate on x, y = 0"
    centre = coords.mean(axis=0)
    centred = coords - centre
    # Eigenvectors of the (dim x dim) scatter matrix: cheap for any number of
    # points, and a full basis even with fewer points than dimensions.
    var, vectors = np.linalg.eigh(centred.T @ centred)
    order = np.argsort(var)[::-1]
    var, axes = np.clip(var[order], 0.0, None), vectors[:, order[:2]].copy()
    for a in range(2):
        if axes[np.argmax(np.abs(axes[:, a])), a] < 0:
            axes[:, a] = -axes[:, a]
    kept = float(var[:2].sum() / var.sum()) if var.sum() > 0 else 1.0
    text = (
        f"a PCA projection of the {dim}-D coordinates onto their first two principal axes "
        f"({100 * kept:.1f} % of the variance); distances on it are approximate"
    )
    return centre, axes, text


def _allocate(totals: Sequence[int], cap: int) -> list[int]:
    """Points to draw per entity: everything when the map fits under ``cap``;
    otherwise equal shares, small entities keeping all their points and
    handing the rest of their share to the larger ones."""
    if sum(totals) <= cap:
        return list(totals)
    quota = [0] * len(totals)
    left, remaining = cap, sorted(range(len(totals)), key=lambda i: totals[i])
    while remaining:
        share = left // len(remaining)
        i = remaining.pop(0)
        quota[i] = min(totals[i], share)
        left -= quota[i]
    return quota


def _sample_rows(total: int, count: int, salt: int) -> np.ndarray:
    if count >= total:
        return np.arange(total)
    rng = np.random.default_rng([SAMPLE_SEED, salt])
    return np.sort(rng.choice(total, size=count, replace=False))


def _colour_of(k: int, n: int) -> str:
    if n <= len(PALETTE):
        return PALETTE[k % len(PALETTE)]
    # More categories than the palette: evenly spaced hues (golden-angle steps).
    hue = (k * 137.508) % 360
    return f"hsl({hue:.0f},62%,{48 + 10 * (k % 2)}%)"


def _value_colouring(index: MapIndex, artifact: Artifact, space: str, entity: str, total: int):
    """(per-row category names or None, ordered category list, note) colouring this layer, or None.

    SCORE aspect maps: the objects' value of that aspect (``SCOREIndex.value_labels``,
    the codes and value labels the artifact ships). KNNSCAL: the class labels
    the artifact may carry (array ``labels``).
    """
    value_labels = getattr(index, "value_labels", None)
    if entity == "objects" and space and callable(value_labels):
        per_row = value_labels(space)
        if per_row is not None:
            order = list(getattr(index, "values", {}).get(space, []))
            order += sorted({v for v in per_row if v is not None and v not in order})
            return per_row, order, f"objects coloured by their value of “{space}”"
    labels = artifact.arrays.get("labels") if artifact.kind == "knnscal" else None
    if entity == "objects" and labels is not None and np.asarray(labels).shape == (total,):
        values = np.asarray(labels)
        order = [f"class {v}" for v in np.unique(values)]
        return [f"class {v}" for v in values], order, "objects coloured by their class label"
    return None


def map_views(
    artifact: Artifact,
    index: MapIndex,
    labels: Mapping[str, str] | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[MapView]:
    """Every map of ``index`` as drawable layers (projected, sampled, coloured, labelled)."""
    names = _Names(
        dict(labels or {}),
        getattr(index, "default_entity", "items"),
        artifact.attributes.get("object_labels"),
    )
    return [
        _map_view(artifact, index, space, salt, names, max_points)
        for salt, space in enumerate(_space_order(index))
    ]


@dataclass
class _Names:
    """Where a point's display name comes from: given labels for the map's main
    entity, SCORE's ``object_labels`` for objects, else the external id."""

    labels: dict[str, str]
    default_entity: str
    object_labels: list | None

    def of(self, entity: str, ids: list[str], rows: np.ndarray, total: int) -> list[str]:
        if entity == self.default_entity and self.labels:
            return [self.labels.get(x, x) for x in ids]
        if entity == "objects" and isinstance(self.object_labels, list) and len(self.object_labels) == total:
            return [str(self.object_labels[r]) for r in rows]
        return list(ids)


def _space_order(index: MapIndex) -> list[str]:
    """The index's spaces in its own order, then any other map; the shared map ("") first."""
    spaces = list(index.spaces())
    order = [s for s in spaces if s in index.maps] + [s for s in index.maps if s not in spaces]
    if not spaces and "" in index.maps:
        order = [""] + [s for s in order if s != ""]
    return order


def _map_title(artifact: Artifact, space: str) -> str:
    if space:
        return f"aspect “{space}”"
    return {"coe": "users and items", "score": "the sphere: objects and aspects", "knnscal": "objects"}.get(
        artifact.kind, "the map"
    )


def _map_view(
    artifact: Artifact, index: MapIndex, space: str, salt: int, names: _Names, max_points: int
) -> MapView:
    """One map: each entity's points sampled to a share of ``max_points``, projected to 2-D."""
    by_entity = index.maps[space]
    entities = list(by_entity)
    totals = [len(by_entity[e].ids) for e in entities]
    quota = _allocate(totals, max_points)
    dim = next(iter(by_entity.values())).dim if by_entity else 2
    drawn = {e: _sample_rows(t, q, salt * 97 + k) for k, (e, t, q) in enumerate(zip(entities, totals, quota))}
    stacked = [by_entity[e].coords[drawn[e]] for e in entities]
    all_coords = np.concatenate(stacked) if stacked else np.empty((0, dim))
    centre, axes, projection = (
        _projection(all_coords) if len(all_coords) else (np.zeros(dim), np.eye(dim, 2), "empty map")
    )
    layers, legend, colour_note = [], [], ""
    for e, total, part in zip(entities, totals, stacked):
        xy = (part - centre) @ axes if len(part) else np.empty((0, 2))
        layer, entries, note = _layer(artifact, index, space, e, by_entity[e], drawn[e], total, xy, names)
        layers.append(layer)
        legend += entries
        colour_note = note or colour_note
    return MapView(space, _map_title(artifact, space), dim, projection, layers, legend, colour_note)


def _layer(
    artifact: Artifact,
    index: MapIndex,
    space: str,
    entity: str,
    points,
    rows: np.ndarray,
    total: int,
    xy: np.ndarray,
    names: _Names,
) -> tuple[Layer, list, str]:
    """One entity's drawn points, its legend entries and the colouring note ("" when plain)."""
    mark, base_colour = ENTITY_STYLE.get(entity, ("circle", "#4e79a7"))
    ids = [points.ids.ids[r] for r in rows]
    shown = names.of(entity, ids, rows, total)
    noun = ENTITY_NOUN.get(entity, entity)
    hover = [f"{name} ({noun} {x})" if name != x else f"{noun} {x}" for name, x in zip(shown, ids)]
    colouring = _value_colouring(index, artifact, space, entity, total)
    if colouring is None:
        colours, legend, note = [base_colour] * len(rows), [(mark, base_colour, f"{entity}", len(rows))], ""
    else:
        colours, hover, legend, note = _coloured(colouring, rows, hover, mark, space)
    text = shown if len(rows) <= TEXT_LABEL_LIMIT and entity == "aspects" else None
    return Layer(entity, mark, rows, total, xy, hover, colours, text), legend, note


def _coloured(colouring, rows: np.ndarray, hover: list[str], mark: str, space: str):
    """Colours, hover texts and legend of a layer coloured by category (values or classes)."""
    per_row, categories, note = colouring
    colour = {c: _colour_of(k, len(categories)) for k, c in enumerate(categories)}
    values = [per_row[r] for r in rows]
    colours = [colour.get(v, MISSING_COLOUR) if v is not None else MISSING_COLOUR for v in values]
    what = space or "class"
    hover = [
        f"{h} · {what} = {v if v is not None else 'missing'}" if space else f"{h} · {v}"
        for h, v in zip(hover, values)
    ]
    counts = {c: 0 for c in categories}
    missing = 0
    for v in values:
        if v is None or v not in counts:
            missing += 1
        else:
            counts[v] += 1
    legend = [(mark, colour[c], c, counts[c]) for c in categories]
    if missing:
        legend.append((mark, MISSING_COLOUR, "missing value", missing))
    return colours, hover, legend, note


# ----------------------------------------------------------------- drawing
def _fit(layers: Sequence[Layer]) -> tuple[float, float, float]:
    """Scale and offsets mapping data to the plot box, same scale on both axes
    (a map's distances are its meaning), y pointing up."""
    xy = np.concatenate([l.xy for l in layers]) if layers else np.empty((0, 2))
    if len(xy) == 0:
        return 1.0, WIDTH / 2, HEIGHT / 2
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    span = np.maximum(hi - lo, 1e-12)
    scale = float(min((WIDTH - 2 * PAD) / span[0], (HEIGHT - 2 * PAD) / span[1]))
    mid = (lo + hi) / 2
    return scale, WIDTH / 2 - scale * float(mid[0]), HEIGHT / 2 + scale * float(mid[1])


def _mark(mark: str, x: float, y: float, colour: str, cls: str, hover: str) -> str:
    title = f"<title>{html.escape(hover)}</title>"
    r = MARK_SIZE
    if mark == "square":
        return (
            f'<rect class="{cls}" x="{x - r:.2f}" y="{y - r:.2f}" width="{2 * r:.2f}" '
            f'height="{2 * r:.2f}" fill="{colour}">{title}</rect>'
        )
    if mark == "diamond":
        d = 1.8 * r
        return (
            f'<path class="{cls}" data-x="{x:.2f}" data-y="{y:.2f}" '
            f'd="M{x:.2f} {y - d:.2f}l{d:.2f} {d:.2f}l{-d:.2f} {d:.2f}l{-d:.2f} {-d:.2f}z" '
            f'fill="{colour}">{title}</path>'
        )
    return f'<circle class="{cls}" cx="{x:.2f}" cy="{y:.2f}" r="{r:.2f}" fill="{colour}">{title}</circle>'


def _legend_swatch(mark: str, colour: str) -> str:
    inner = {
        "square": f'<rect x="2" y="2" width="8" height="8" fill="{colour}"/>',
        "diamond": f'<path d="M6 0.5l5.5 5.5l-5.5 5.5l-5.5-5.5z" fill="{colour}"/>',
    }.get(mark, f'<circle cx="6" cy="6" r="4.5" fill="{colour}"/>')
    return f'<svg class="sw" width="12" height="12" viewBox="0 0 12 12" aria-hidden="true">{inner}</svg>'


def _svg(view: MapView, number: int) -> str:
    scale, ox, oy = _fit(view.layers)
    parts = []
    n_points = 0
    # Larger layers first, so a small one (COE users under many items) is drawn on top.
    for layer in sorted(view.layers, key=lambda l: -len(l.rows)):
        cls = f"pt e-{html.escape(layer.entity)}"
        for (dx, dy), colour, hover in zip(layer.xy, layer.colours, layer.hover):
            parts.append(_mark(layer.mark, ox + scale * dx, oy - scale * dy, colour, cls, hover))
        n_points += len(layer.rows)
    texts = []
    for layer in view.layers:
        if layer.text:
            for (dx, dy), name in zip(layer.xy, layer.text):
                x, y = ox + scale * dx, oy - scale * dy
                # labels in the right quarter go to the left of their mark, so they stay in the box
                shift, anchor = (-8, "end") if x > 0.75 * WIDTH else (8, "start")
                texts.append(
                    f'<text class="lbl" x="{x + shift:.2f}" y="{y + 5:.2f}" data-x="{x:.2f}" '
                    f'data-y="{y:.2f}" data-dx="{shift}" text-anchor="{anchor}">'
                    f"{html.escape(name)}</text>"
                )
    aria = html.escape(f"map {number}: {view.title}, {n_points} points")
    return (
        f'<svg class="scatter" id="map-{number}" viewBox="0 0 {WIDTH:.0f} {HEIGHT:.0f}" '
        f'data-points="{n_points}" data-k="1" role="img" aria-label="{aria}">'
        f'<rect class="bg" x="0" y="0" width="{WIDTH:.0f}" height="{HEIGHT:.0f}"/>'
        f'<g class="points">{"".join(parts)}</g><g class="labels">{"".join(texts)}</g></svg>'
    )


def _fmt(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:.1f}"


def _fmt_metric(metric: str, value: float) -> str:
    if metric.startswith(_ACCURACY_PREFIXES) and value is not None and math.isfinite(value):
        # Our metrics are fractions; a value above 1 was already a percentage.
        return f"{(value * 100 if abs(value) <= 1 else value):.1f} %"
    return _fmt(value)


def _setting(setting: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items())


def _metrics_table(artifact: Artifact, paper: Sequence[PaperFigure]) -> str:
    metrics = {k: float(v) for k, v in artifact.metrics.items()}
    names = list(dict.fromkeys(list(metrics) + [p.metric for p in paper]))
    if not names:
        return '<p class="note">This version records no evaluation metrics.</p>'

    def source(p: PaperFigure) -> str:
        return f"{p.method}, {_setting(p.setting)}" + (f" ({p.note})" if p.note else "")

    sources = list(dict.fromkeys(source(p) for p in paper))
    one_source = len(sources) <= 1  # then it is said once, above the table
    rows = []
    for name in names:
        ours = _fmt_metric(name, metrics[name]) if name in metrics else "not recorded"
        figures = [p for p in paper if p.metric == name] or [None]
        for k, p in enumerate(figures):
            cells = [html.escape(name) if k == 0 else "", ours if k == 0 else ""]
            cells.append("–" if p is None else _fmt_metric(p.metric, p.value))
            if not one_source:
                cells.append("" if p is None else html.escape(source(p)))
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "<th>metric</th><th>this version</th><th>paper</th>" + (
        "" if one_source else "<th>paper source</th>"
    )
    caption = (
        f'<p class="note">Paper figures: {html.escape(sources[0])}.</p>' if one_source and sources else ""
    )
    caveat = (
        ""
        if not paper
        else "<p class=\"note\">The paper's figures are for the paper's data set and protocol; "
        "this version's metrics are for its own data and evaluation, so compare them only "
        "when those match.</p>"
    )
    return (
        caption
        + f'<table class="metrics"><thead><tr>{head}</tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table>"
        + caveat
    )


def _kv_table(data: Mapping) -> str:
    if not data:
        return '<p class="note">none</p>'
    rows = []
    for key, value in data.items():
        text = json.dumps(value, default=str) if not isinstance(value, str) else value
        if len(text) > 300:
            text = text[:300] + " …"
        rows.append(f"<tr><th>{html.escape(str(key))}</th><td>{html.escape(text)}</td></tr>")
    return '<table class="kv">' + "".join(rows) + "</table>"


_CSS = """
:root{--fg:#1d1d1f;--muted:#666;--line:#ddd}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0;
padding:18px 24px 40px;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 4px}
.meta{color:var(--muted);margin:0 0 14px}.meta b{color:var(--fg);font-weight:600}
.note{color:var(--muted);font-size:12.5px;margin:4px 0}
table{border-collapse:collapse;background:#fff;font-size:13px}
td,th{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
table.metrics td:nth-child(2),table.metrics td:nth-child(3){text-align:right;white-space:nowrap}
details{margin:4px 0}summary{cursor:pointer;color:var(--muted)}
.maps{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:16px}
.map,.panel{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 12px}
.panel table{width:100%}
@media (min-width:820px){.panel{grid-column:span 2}}
.plot{position:relative}
svg.scatter{width:100%;height:auto;display:block;cursor:grab;touch-action:none;user-select:none}
svg.scatter.drag{cursor:grabbing}
svg.scatter .bg{fill:#fcfcfc;stroke:#e2e2e2}
svg.scatter .pt{stroke:#fff;stroke-width:.6;fill-opacity:.88}
svg.scatter .pt:hover{stroke:#000;stroke-width:1.4}
svg.scatter .lbl{font-size:14px;fill:#222;pointer-events:none;paint-order:stroke;stroke:#fff;stroke-width:3px}
.legend{display:flex;flex-wrap:wrap;gap:4px 12px;margin-top:6px;font-size:12.5px}
.legend span{display:inline-flex;align-items:center;gap:4px}
.tools{float:right}.tools button{font-size:12px;padding:1px 8px;cursor:pointer}
.tip{position:absolute;pointer-events:none;background:rgba(20,20,20,.9);color:#fff;font-size:12px;
padding:3px 7px;border-radius:4px;white-space:nowrap;display:none;z-index:2}
"""

# Semantic zoom: the marks keep their size and the positions are recomputed
# (screen = base * k + t), so dense maps stay readable when zoomed in.
_JS = r"""
(function () {
  "use strict";
  var drawn = 0;
  function setup(svg) {
    var marks = Array.prototype.slice.call(svg.querySelectorAll(".pt, .lbl"));
    var base = marks.map(function (m) {
      var tag = m.tagName.toLowerCase();
      if (tag === "circle") return [+m.getAttribute("cx"), +m.getAttribute("cy")];
      if (tag === "rect") return [+m.getAttribute("x") + (+m.getAttribute("width")) / 2,
                                  +m.getAttribute("y") + (+m.getAttribute("height")) / 2];
      return [+m.getAttribute("data-x"), +m.getAttribute("data-y")];
    });
    var paths = marks.map(function (m) { return m.tagName.toLowerCase() === "path" ? m.getAttribute("d") : null; });
    var k = 1, tx = 0, ty = 0, pending = false;
    function draw() {
      pending = false;
      for (var i = 0; i < marks.length; i++) {
        var m = marks[i], x = base[i][0] * k + tx, y = base[i][1] * k + ty, tag = m.tagName.toLowerCase();
        if (tag === "circle") { m.setAttribute("cx", x.toFixed(2)); m.setAttribute("cy", y.toFixed(2)); }
        else if (tag === "rect") {
          var w = +m.getAttribute("width");
          m.setAttribute("x", (x - w / 2).toFixed(2)); m.setAttribute("y", (y - w / 2).toFixed(2));
        } else if (tag === "path") {
          m.setAttribute("transform", "translate(" + (x - base[i][0]).toFixed(2) + " " + (y - base[i][1]).toFixed(2) + ")");
        } else {
          m.setAttribute("x", (x + (+m.getAttribute("data-dx"))).toFixed(2)); m.setAttribute("y", (y + 5).toFixed(2));
        }
      }
      svg.setAttribute("data-k", k.toFixed(4));
    }
    function schedule() { if (!pending) { pending = true; window.requestAnimationFrame(draw); } }
    function local(evt) {
      var p = svg.createSVGPoint(); p.x = evt.clientX; p.y = evt.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse());
    }
    svg.addEventListener("wheel", function (evt) {
      evt.preventDefault();
      var p = local(evt), f = Math.exp(-evt.deltaY * (evt.deltaMode === 1 ? 0.05 : 0.0015));
      var k2 = Math.min(500, Math.max(0.25, k * f));
      tx = p.x - (p.x - tx) * (k2 / k); ty = p.y - (p.y - ty) * (k2 / k); k = k2;
      schedule();
    }, { passive: false });
    var start = null;
    svg.addEventListener("pointerdown", function (evt) {
      if (evt.button !== 0) return;
      start = { p: local(evt), tx: tx, ty: ty };
      svg.classList.add("drag");
      if (svg.setPointerCapture) { try { svg.setPointerCapture(evt.pointerId); } catch (e) {} }
    });
    svg.addEventListener("pointermove", function (evt) {
      if (!start) return;
      var p = local(evt);
      tx = start.tx + p.x - start.p.x; ty = start.ty + p.y - start.p.y;
      schedule();
    });
    function stop() { start = null; svg.classList.remove("drag"); }
    svg.addEventListener("pointerup", stop);
    svg.addEventListener("pointercancel", stop);
    function reset() { k = 1; tx = 0; ty = 0; schedule(); }
    svg.addEventListener("dblclick", reset);
    var button = document.querySelector('button[data-reset="' + svg.id + '"]');
    if (button) button.addEventListener("click", reset);
    var tip = svg.parentNode.querySelector(".tip");
    svg.addEventListener("mouseover", function (evt) {
      var m = evt.target.closest ? evt.target.closest(".pt") : null;
      if (!m || !tip) return;
      var title = m.querySelector("title");
      tip.textContent = title ? title.textContent : "";
      tip.style.display = "block";
    });
    svg.addEventListener("mousemove", function (evt) {
      if (!tip || tip.style.display !== "block") return;
      var box = svg.parentNode.getBoundingClientRect();
      tip.style.left = (evt.clientX - box.left + 12) + "px";
      tip.style.top = (evt.clientY - box.top + 12) + "px";
    });
    svg.addEventListener("mouseout", function (evt) {
      if (tip && evt.target.closest && evt.target.closest(".pt")) tip.style.display = "none";
    });
    var expected = +svg.getAttribute("data-points");
    var count = svg.querySelectorAll(".pt").length;
    if (count !== expected) throw new Error(svg.id + ": " + count + " marks, expected " + expected);
    drawn += count;
  }
  var svgs = document.querySelectorAll("svg.scatter");
  for (var i = 0; i < svgs.length; i++) setup(svgs[i]);
  document.body.setAttribute("data-drawn", String(drawn));
  document.body.setAttribute("data-ready", "1");
})();
"""
# The report's one script, as the server's Content-Security-Policy names it.
_JS_HASH = base64.b64encode(hashlib.sha256(_JS.encode("utf-8")).digest()).decode("ascii")


def _ensure_map_index(artifact: Artifact, index) -> MapIndex:
    if index is None:
        index = index_class(artifact.kind).from_artifact(artifact)
    if not isinstance(index, MapIndex) or not index.maps:
        raise ValueError(f"{artifact.describe()} is not a map model: no map to draw")
    return index


def render_report(
    artifact: Artifact,
    index: MapIndex | None = None,
    labels: Mapping[str, str] | None = None,
    paper: list | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> str:
    """One self-contained HTML page showing every map of a version.

    Parameters
    ----------
    artifact:
        The version (published or in memory).
    index:
        Its serving index; built with the kind's ``from_artifact`` when omitted.
    labels:
        Display labels of the map's main entity (``index.default_entity``:
        COE items, SCORE and KNNSCAL objects) by external id, e.g. movie titles
        from :func:`read_labels`. SCORE's ``object_labels`` attribute is used
        when no labels are given.
    paper:
        :class:`PaperFigure` rows to show beside the metrics; default
        :func:`paper_figures` of the kind.
    max_points:
        Cap on drawn points per map; larger maps are sampled deterministically
        and the page says so.
    """
    index = _ensure_map_index(artifact, index)
    if paper is None:
        paper = paper_figures(artifact.kind, artifact.hyperparameters, artifact.attributes)
    views = map_views(artifact, index, labels, max_points)
    name = artifact.name or "(unpublished)"
    esc = html.escape
    sections = []
    for number, view in enumerate(views, start=1):
        counts = []
        for layer in view.layers:
            shown = len(layer.rows)
            noun = layer.entity
            if shown < layer.total:
                counts.append(
                    f"{shown:,} of {layer.total:,} {noun} (a deterministic random sample, "
                    f"seed {SAMPLE_SEED}; the cap is {max_points:,} points per map)"
                )
            else:
                counts.append(f"{shown:,} {noun}")
        legend = "".join(f"<span>{_legend_swatch(m, c)}{esc(t)} ({n:,})</span>" for m, c, t, n in view.legend)
        sections.append(
            f'<section class="map" data-space="{esc(view.space)}">'
            f'<div class="tools"><button type="button" data-reset="map-{number}">reset view</button></div>'
            f"<h2>{number}. {esc(view.title)}</h2>"
            f'<p class="note">{esc("; ".join(counts))}. Drawn: {esc(view.projection)}.'
            f"{' ' + esc(view.colour_note) + '.' if view.colour_note else ''}</p>"
            f'<div class="plot">{_svg(view, number)}<div class="tip"></div></div>'
            f'<div class="legend">{legend}</div></section>'
        )
    shape = ", ".join(f"{space}: {len(ids):,}" for space, ids in artifact.ids.items())
    created = artifact.created_at or "not published"
    version = artifact.version or "in memory"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{esc(name)} · {esc(artifact.kind)} map report</title>
<style>{_CSS}</style></head>
<body data-kind="{esc(artifact.kind)}" data-maps="{len(views)}">
<h1>{esc(name)} <span class="note">({esc(artifact.kind)} maps)</span></h1>
<p class="meta">model <b>{esc(name)}</b> · kind <b>{esc(artifact.kind)}</b> · version <b>{esc(version)}</b>
 · created {esc(created)} · ids {esc(shape)}{(" · data " + esc(artifact.data_fingerprint[:16])) if artifact.data_fingerprint else ""}</p>
<p class="note">Wheel to zoom around the pointer, drag to pan, double-click or “reset view” to go back;
hover a mark for its label. {len(views)} map{"s" if len(views) != 1 else ""}; marks:
circle = {"user" if artifact.kind == "coe" else "object"}{", square = item" if artifact.kind == "coe" else ""}{", diamond = aspect" if artifact.kind == "score" else ""}.
Both axes share one scale.</p>
<div class="maps">{"".join(sections)}
<section class="panel" id="metrics"><h2>Evaluation metrics of this version</h2>{_metrics_table(artifact, paper)}
<details><summary>hyperparameters</summary>{_kv_table(artifact.hyperparameters)}</details>
<details><summary>attributes</summary>{_kv_table({k: v for k, v in artifact.attributes.items() if k != "object_labels"})}</details></section></div>
<script>{_JS}</script>
</body></html>
"""
    return page


def report_views(
    artifact: Artifact, labels: Mapping[str, str] | None = None, index: MapIndex | None = None
) -> dict[str, View]:
    """Files to publish beside a version: ``report.html`` and, when labels
    are given, ``labels.tsv`` (so ``ordrec-train report`` can redraw the
    report with the same labels later).

    For ``Registry.publish``, pass it as a callable so the page shows the
    version and its creation time, which exist only once publishing starts::

        registry.publish(name, artifact, views=lambda a: report_views(a, labels))
    """
    views = {
        REPORT_FILE: View(render_report(artifact, index, labels).encode("utf-8"), script_hashes=(_JS_HASH,))
    }
    if labels:
        views[LABELS_FILE] = View(format_labels(labels))
    return views


def write_report(
    registry: Registry | str | os.PathLike,
    name: str,
    version: str | None = None,
    labels_path: str | os.PathLike | None = None,
) -> Path:
    """(Re)write ``report.html`` in a published version's folder (default: the live one).

    Labels come from ``labels_path`` when given (and are kept as the
    ``labels.tsv`` view for the next redraw), else from the version's
    ``labels.tsv`` view. The manifest is replaced atomically after the new
    files are written; returns the report's path.
    """
    if not isinstance(registry, Registry):
        registry = Registry(registry)
    artifact = registry.load(name, version, views=False)  # the old report may be what is being repaired
    folder = artifact.path
    labels = None
    if labels_path is not None:
        labels = read_labels(labels_path)
    else:
        kept = read_view(folder, LABELS_FILE)
        labels = parse_labels(kept, folder / LABELS_FILE) if kept is not None else None
    views = report_views(artifact, labels)
    manifest = write_views(folder, views)
    return folder / next(e.path for e in manifest.views if e.name == REPORT_FILE)
