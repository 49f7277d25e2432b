"""Item metadata readers (MovieLens u.item / movies.dat, typed csv) and their path into a version."""

from __future__ import annotations

import numpy as np
import pytest

from ordrec.service.indices.item_attributes import ItemAttributeError, read_item_attributes
from ordrec.service.indices.models import build_index
from ordrec.service.storage.idmap import IdMap
from ordrec.service.storage.registry import Registry
from ordrec.trainer.job import run_job
from ordrec.trainer.sample import write_samples
from tests.conftest import data_file


def test_ml100k_u_item_gives_genres_and_years():
    table = read_item_attributes(data_file("ml-100k", "u.item"))
    assert table.categorical["genre"]["1"] == ["Animation", "Children's", "Comedy"]  # Toy Story
    assert table.numeric["year"]["1"] == 1995.0
    assert len(table.categorical["genre"]) == 1682
    assert "267" not in table.numeric["year"]  # the one movie without a release date


def test_ml100k_format_errors_name_the_line(tmp_path):
    path = tmp_path / "u.item"
    path.write_bytes(
        b"1|Toy Story (1995)|01-Jan-1995||http://x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0\n"
        b"2|GoldenEye (1995)|01-Jan-1995||http://x|0|1\n"
    )
    with pytest.raises(ItemAttributeError, match=r"u.item:2: expected 24"):
        read_item_attributes(path)


def test_movies_dat_gives_genres_and_the_year_in_the_title(tmp_path):
    path = tmp_path / "movies.dat"
    path.write_bytes(
        "1::Toy Story (1995)::Animation|Children's|Comedy\n2::Jumanji (1995)::Adventure\n"
        "3::Am\xe9lie::Comedy|Romance\n".encode("latin-1")
    )
    table = read_item_attributes(path)
    assert table.categorical["genre"] == {
        "1": ["Animation", "Children's", "Comedy"],
        "2": ["Adventure"],
        "3": ["Comedy", "Romance"],
    }
    assert table.numeric["year"] == {"1": 1995.0, "2": 1995.0}


def test_csv_columns_are_typed_and_multi_valued(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("sku,brand,price,tags,in stock\na,Acme,9.5,red|sale,1\nb,Globex,,blue,0\nc,,12,,\n")
    table = read_item_attributes(path)
    assert set(table.numeric) == {"price", "in_stock"} and set(table.categorical) == {"brand", "tags"}
    assert table.categorical["tags"] == {"a": ["red", "sale"], "b": ["blue"]}
    assert table.numeric["price"] == {"a": 9.5, "c": 12.0}
    arrays, meta = table.to_artifact_parts(IdMap(["c", "a", "zz"]))
    price = arrays[f"itemattr_{[m['name'] for m in meta].index('price')}_num"]
    np.testing.assert_array_equal(price, [12.0, 9.5, np.nan])  # zz is not in the file: no value
    with pytest.raises(ItemAttributeError, match="items.csv:3: 2 fields"):
        path.write_text("sku,brand,price\na,Acme,1\nb,Globex\n")
        read_item_attributes(path)


def test_the_cron_job_publishes_item_attributes(tmp_path):
    sample = tmp_path / "sample"
    write_samples(sample)
    items = [line.split("|")[0] for line in (sample / "items.txt").read_text().splitlines() if line]
    (tmp_path / "items.csv").write_text(
        "item,year\n" + "".join(f"{i},{1900 + k}\n" for k, i in enumerate(items))
    )
    job = tmp_path / "job.toml"
    job.write_text(f"""
[job]
name = "attrs"
registry = "{tmp_path / "registry"}"

[data.ratings]
path = "{sample / "ratings.data"}"
format = "ml-100k"

[[models]]
name = "dcr"
kind = "dcr"
data = "ratings"
params = {{ n_components = 3, max_iter = 2 }}
item_attributes = "items.csv"
gate = {{ holdout = 0.2, popularity_floor = false }}  # the sample: popularity-only picks
""")
    assert run_job(job) == 0
    index = build_index(Registry(tmp_path / "registry").load("dcr"))
    eligible = index.item_attributes.eligible("year >= 1950")
    years = {i: 1900 + k for k, i in enumerate(items)}
    assert {index.items.external(int(r)) for r in eligible.rows} == {
        i for i in index.items.ids if years.get(i, 0) >= 1950
    }
