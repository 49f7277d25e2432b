"""ordrec-train as a user runs it: explicit judgement files, data errors naming
file and line, and the version-management commands."""

from __future__ import annotations

import numpy as np

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import run_cli


def _train(*args):
    return run_cli(["ordrec.trainer", "train", *args], check=False)


def test_explicit_triple_files_train_coe_and_score(tmp_path):
    rng = np.random.default_rng(0)
    triples, triplets = tmp_path / "coe.txt", tmp_path / "score.csv"
    lines = [f"A u{u} i{i} i{j}" for u, i, j in rng.integers(0, 20, (300, 3)) if i != j]
    lines += [f"B u{u} u{v} i{i}" for u, v, i in rng.integers(0, 20, (300, 3)) if u != v]
    triples.write_text("\n".join(lines) + "\n")
    triplets.write_text(
        "".join(
            f"asp{rng.integers(0, 2)},{','.join(f'o{x}' for x in rng.choice(15, 3, replace=False))}\n"
            for _ in range(300)
        )
    )
    registry = tmp_path / "reg"
    for kind, path, fmt in (("coe", triples, "triples"), ("score", triplets, "triplets")):
        result = _train(
            kind, "--data", str(path), "--format", fmt, "--registry", str(registry), "--set", "max_iter=2"
        )
        assert result.returncode == 0, result.stderr
    assert Registry(registry).models() == ["coe", "score"]
    wrong = _train("dcr", "--data", str(triples), "--format", "triplets", "--registry", str(registry))
    assert wrong.returncode == 2 and "not ratings" in wrong.stderr


def test_bad_data_fails_with_file_and_line(tmp_path):
    data = tmp_path / "u.data"
    data.write_text("1\t1\t5\t100\n2\t1\tfive\t100\n")
    result = _train("dcr", "--data", str(data), "--registry", str(tmp_path / "reg"))
    assert result.returncode == 2
    assert f"{data}:2" in result.stderr and "five" in result.stderr
    assert not (tmp_path / "reg").exists() or Registry(tmp_path / "reg").versions("dcr") == []


def test_unknown_hyperparameter_is_a_clear_error(sample_dir, tmp_path):
    result = _train(
        "dcr",
        "--data",
        str(sample_dir / "ratings.data"),
        "--registry",
        str(tmp_path / "r"),
        "--set",
        "rnak=3",
    )
    assert result.returncode != 0 and "rnak" in result.stderr and "Traceback" not in result.stderr


def test_versions_pin_unpin_prune(sample_registry, tmp_path):
    registry = Registry(tmp_path / "reg")
    artifact = Registry(sample_registry).load("dcr", mmap=False)
    versions = [registry.publish("dcr", artifact) for _ in range(3)]
    reg = ["--registry", str(registry.root)]
    listing = run_cli(["ordrec.trainer", "versions", *reg]).stdout
    assert f"dcr\t{versions[-1]}\tlive:newest" in listing
    run_cli(["ordrec.trainer", "pin", *reg, "--model", "dcr", "--version", versions[0]])
    assert registry.live_version("dcr") == (versions[0], "pinned")
    assert "pinned" in run_cli(["ordrec.trainer", "versions", *reg, "--model", "dcr"]).stdout
    assert run_cli(["ordrec.trainer", "prune", *reg, "--model", "dcr", "--keep", "1"]).returncode == 0
    assert registry.versions("dcr") == [versions[0], versions[-1]]
    run_cli(["ordrec.trainer", "unpin", *reg, "--model", "dcr"])
    assert registry.live_version("dcr") == (versions[-1], "newest")
    bad = run_cli(["ordrec.trainer", "pin", *reg, "--model", "dcr", "--version", "nope"], check=False)
    assert bad.returncode != 0 and "unknown version" in bad.stderr


def test_map_models_publish_fit_metrics_and_a_report(sample_dir, tmp_path):
    registry = tmp_path / "reg"
    for kind, sample, flags in (
        ("coe", "ratings.data", ["--labels", str(sample_dir / "items.txt")]),
        ("score", "attributes.csv", []),
    ):
        result = _train(
            kind,
            "--data",
            str(sample_dir / sample),
            "--registry",
            str(registry),
            "--set",
            "max_iter=3",
            *flags,
        )
        assert result.returncode == 0, result.stderr
        artifact = Registry(registry).load(kind)
        assert 0.5 < artifact.metrics["preservation_h" if kind == "coe" else "preservation"] <= 1.0
        report = artifact.views["report.html"].data.decode()
        assert artifact.version in report and "preservation" in report


def test_ratings_off_the_declared_scale_fail_or_are_skipped(sample_dir, tmp_path):
    data = tmp_path / "u.data"
    good = (sample_dir / "ratings.data").read_text()
    data.write_text(good + "90001\t90001\t99\t881250949\n90002\t90001\t-1\tnot-a-time\n")
    registry = tmp_path / "reg"
    result = _train("dcr", "--data", str(data), "--registry", str(registry), "--set", "max_iter=2")
    n_good = good.count("\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{data}:{n_good + 1}: rating '99' is outside the rating scale 1..5" in result.stderr
    assert not registry.exists() or Registry(registry).versions("dcr") == []
    result = _train(
        "dcr", "--data", str(data), "--registry", str(registry), "--set", "max_iter=2", "--skip-bad-lines"
    )
    assert result.returncode == 0, result.stderr
    assert f"skipped 2 malformed line(s) of {data}" in result.stderr
    assert Registry(registry).load("dcr").attributes["levels"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_rating_scale_option(sample_dir, tmp_path):
    data = tmp_path / "r.csv"
    data.write_text("user,item,rating\n" + "".join(f"u{k % 7},i{k % 11},{k % 9 + 1}\n" for k in range(77)))
    bad = _train("dcr", "--data", str(data), "--registry", str(tmp_path / "reg"), "--rating-scale", "1..5")
    assert bad.returncode == 2 and f"{data}:7: rating '6' is outside the rating scale 1..5" in bad.stderr
    usage = _train("dcr", "--data", str(data), "--registry", str(tmp_path / "reg"), "--rating-scale", "5..1")
    assert usage.returncode == 2 and "--rating-scale" in usage.stderr and "empty" in usage.stderr
    tags = _train(
        "rtf",
        "--data",
        str(sample_dir / "tags.csv"),
        "--registry",
        str(tmp_path / "reg"),
        "--rating-scale",
        "1..5",
    )
    assert tags.returncode == 2 and "a rating scale is for ratings files, not tags" in tags.stderr


def test_reproduce_takes_a_rating_scale_only_for_ratings_protocols():
    from ordrec.trainer.cli import build_parser
    from ordrec.trainer.data.types import RatingScale

    for kind in ("dcr", "coe"):
        args = build_parser(kind).parse_args(
            ["reproduce", kind, "--data", "x", "--rating-scale", "0.5..5:0.5"]
        )
        assert args.rating_scale == RatingScale(0.5, 5, 0.5)

    def protocol_help(kind):
        reproduce = build_parser(kind)._subparsers._group_actions[0].choices["reproduce"]
        return reproduce._subparsers._group_actions[0].choices[kind].format_help()

    assert "--rating-scale" in protocol_help("dcr") and "--rating-scale" not in protocol_help("rtf")
