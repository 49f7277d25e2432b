"""deploy/: the Kubernetes manifests render, validate offline against the Kubernetes schemas
(``kubernetes-validate``), and keep what docs/deploy.md promises (``make deploy-check``)."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_checker():
    try:
        import kubernetes_validate  # noqa: F401
        import yaml  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("kubernetes-validate is a dev dependency and must be installed in CI")
        pytest.skip("kubernetes-validate not installed (pip install -e '.[dev]')")
    spec = importlib.util.spec_from_file_location("deploy_check", ROOT / "scripts" / "deploy_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["deploy_check"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checker():
    return _load_checker()


def test_every_kustomization_renders_and_validates(checker, capsys):
    assert checker.main([]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "deploy/base" in out and "deploy/overlays/example" in out


def test_the_checks_catch_what_they_claim_to(checker):
    objects = checker.render_python(ROOT / "deploy" / "overlays" / "example")
    assert checker.schema_problems(objects) == [] and checker.policy_problems(objects, complete=True) == []
    broken = copy.deepcopy(objects)
    serve = next(o for o in broken if o["kind"] == "Deployment" and o["metadata"]["name"] == "ordrec-serve")
    container = serve["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # a misspelt field: strict schemas refuse it
    assert any("readinesProbe" in p for p in checker.schema_problems(broken, versions=["1.33.0"]))
    container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 9095}}
    del container["securityContext"]["readOnlyRootFilesystem"]
    del container["resources"]["limits"]["memory"]
    cron = next(o for o in broken if o["kind"] == "CronJob")
    cron["spec"]["concurrencyPolicy"] = "Allow"
    service = next(o for o in broken if o["kind"] == "Service" and o["metadata"]["name"] == "ordrec-serve")
    del service["spec"]["clusterIP"]
    container["args"] = [a for a in container["args"] if not a.startswith("--metrics-host=")]
    container["args"] = [a.replace("--metrics-port=9095", "--metrics-port=9096") for a in container["args"]]
    problems = "\n".join(checker.policy_problems(broken, complete=True))
    for words in (
        "readinessProbe must be a native grpc probe",
        "readOnlyRootFilesystem",
        "resources.limits.memory",
        "concurrencyPolicy: Forbid",
        "headless",
        "pass --metrics-host=0.0.0.0",
        "--metrics-port (9096), the prometheus.io/port annotation (9095)",
    ):
        assert words in problems


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: nothing to compare with")
def test_the_builtin_renderer_matches_kubectl(checker):
    """The fallback renderer (for machines without kubectl) yields the same objects, up to
    kubectl's hash suffix on generated names."""
    for folder in checker.targets():
        ours = checker.render_python(folder)
        theirs = checker.render_kubectl(folder)
        names = {o["metadata"]["name"] for o in ours}

        def unhashed(obj, names=names):
            name = obj["metadata"]["name"]
            base = name.rsplit("-", 1)[0]
            return base if name not in names and base in names else name

        assert sorted((o["kind"], o["metadata"]["name"]) for o in ours) == sorted(
            (o["kind"], unhashed(o)) for o in theirs
        )
        by_key = {(o["kind"], o["metadata"]["name"]): o for o in ours}
        for obj in theirs:
            mine = by_key[(obj["kind"], unhashed(obj))]
            assert mine.get("metadata", {}).get("namespace") == obj["metadata"].get("namespace")
            assert mine["metadata"].get("labels") == obj["metadata"].get("labels")
            assert [c["image"] for c in checker.containers(mine)] == [
                c["image"] for c in checker.containers(obj)
            ]


def test_the_configmap_job_file_is_a_valid_job(checker, tmp_path):
    from ordrec.trainer.job import load_job

    objects = checker.render_python(ROOT / "deploy" / "base")
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    path = tmp_path / "job.toml"
    path.write_text(config["data"]["job.toml"])
    job = load_job(path)
    assert job.registry == config["data"]["ORDREC_REGISTRY"]
    assert job.redis == config["data"]["ORDREC_REDIS_URL"]
