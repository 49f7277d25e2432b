#!/usr/bin/env python3
"""``make deploy-check``: render every kustomization under deploy/ and validate it offline.

1. Render: ``kubectl kustomize DIR`` when kubectl is installed, else a small renderer of
   the kustomize features deploy/ uses (resources, namespace, labels, images, config map
   and secret generators), which the test suite compares with kubectl's output where
   both exist.
2. Validate every object against the Kubernetes OpenAPI schemas of the oldest and the
   newest version we support (``kubernetes-validate``, strict: unknown fields fail).
3. Check what an operator relies on and a schema cannot see: non-root, read-only root
   filesystems, resource requests and limits, native gRPC probes, a headless Service,
   a Forbid CronJob, an autoscaler and a disruption budget for the servers.

Exit status 0 when everything holds; the problems are printed otherwise.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# Native gRPC probes are GA from 1.27 and CronJob timeZone from 1.27: the oldest we claim.
KUBERNETES_VERSIONS = ("1.27.0", "1.33.0")
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "StorageClass"}


def targets() -> list[Path]:
    """Every kustomization that is meant to be applied on its own: the base and the overlays."""
    return [DEPLOY / "base", *sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))]


# ---------------------------------------------------------------- rendering
def render_kubectl(folder: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render_python(folder: Path) -> list[dict]:
    """The subset of kustomize deploy/ uses. Generated names get no hash suffix."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            objects += render_python(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for gen in kustomization.get(key, []):
            objects.append(_generated(folder, kind, gen))
    for label in kustomization.get("labels", []):
        for obj in objects:
            _add_labels(obj, label["pairs"], label.get("includeTemplates", False))
    images = {i["name"]: i for i in kustomization.get("images", [])}
    for obj in objects:
        for container in containers(obj):
            _set_image(container, images)
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = namespace
    return objects


def _generated(folder: Path, kind: str, gen: dict) -> dict:
    data: dict[str, str] = {}
    for spec in gen.get("files", []):
        key, _, name = spec.rpartition("=")
        text = (folder / name).read_text()
        data[key or Path(name).name] = text
    for spec in gen.get("literals", []):
        key, _, value = spec.partition("=")
        data[key] = value
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": gen["name"]}}
    if kind == "Secret":
        obj["type"] = gen.get("type", "Opaque")
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    return obj


def _pod_templates(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if "template" in spec:
        return [spec["template"]]
    if "jobTemplate" in spec:
        return [spec["jobTemplate"]["spec"]["template"]]
    return []


def containers(obj: dict) -> Iterable[dict]:
    for template in _pod_templates(obj):
        pod = template.get("spec", {})
        yield from pod.get("initContainers", [])
        yield from pod.get("containers", [])


def _add_labels(obj: dict, pairs: dict, templates: bool) -> None:
    obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    if templates:
        for template in _pod_templates(obj):
            template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _set_image(container: dict, images: dict) -> None:
    name, _, tag = container["image"].partition(":")
    if name in images:
        new = images[name]
        container["image"] = f"{new.get('newName', name)}:{new.get('newTag', tag)}".rstrip(":")


def render(folder: Path) -> tuple[list[dict], str]:
    if shutil.which("kubectl"):
        return render_kubectl(folder), "kubectl kustomize"
    return render_python(folder), "the built-in renderer (no kubectl)"


# --------------------------------------------------------------- validation
def schema_problems(objects: list[dict], versions: Iterable[str] = KUBERNETES_VERSIONS) -> list[str]:
    import kubernetes_validate

    problems = []
    for version in versions:
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = "/".join(str(p) for p in exc.path)
                problems.append(f"{_name(obj)} (Kubernetes {version}): {path}: {exc.message}")
            except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
                problems.append(f"{_name(obj)} (Kubernetes {version}): no schema: {exc}")
    return problems


def _name(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def policy_problems(objects: list[dict], complete: bool) -> list[str]:
    """What deploy/ promises beyond the schemas. ``complete``: a whole installation (an
    overlay), which must also bring the Secret the servers mount."""
    problems = []
    by_kind: dict[str, dict[str, dict]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    for obj in objects:
        for template in _pod_templates(obj):
            problems += _pod_problems(_name(obj), template["spec"])
    serve = by_kind.get("Deployment", {}).get("ordrec-serve")
    if serve is None:
        return problems + ["no Deployment ordrec-serve"]
    container = serve["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        if container.get(probe, {}).get("grpc", {}).get("port") != 50051:
            problems.append(f"ordrec-serve: {probe} must be a native grpc probe on port 50051")
    problems += _metrics_problems(serve["spec"]["template"], container)
    service = by_kind.get("Service", {}).get("ordrec-serve")
    if service is None or service["spec"].get("clusterIP") != "None":
        problems.append("Service ordrec-serve must be headless (clusterIP: None) for client-side balancing")
    hpa = by_kind.get("HorizontalPodAutoscaler", {}).get("ordrec-serve")
    if hpa is None or hpa["spec"]["scaleTargetRef"]["name"] != "ordrec-serve":
        problems.append("no HorizontalPodAutoscaler for ordrec-serve")
    if "PodDisruptionBudget" not in by_kind:
        problems.append("no PodDisruptionBudget")
    cron = by_kind.get("CronJob", {}).get("ordrec-train")
    if cron is None or cron["spec"].get("concurrencyPolicy") != "Forbid":
        problems.append("CronJob ordrec-train must exist with concurrencyPolicy: Forbid")
    elif cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][:2] != [
        "ordrec-train",
        "run",
    ]:
        problems.append("CronJob ordrec-train must run `ordrec-train run`")
    problems += _training_cluster_problems(by_kind)
    if complete:
        # kubectl renames a generated Secret (hash suffix) and rewrites its references alike.
        for volume in serve["spec"]["template"]["spec"]["volumes"]:
            name = volume.get("secret", {}).get("secretName")
            if name and name not in by_kind.get("Secret", {}):
                problems.append(f"ordrec-serve mounts Secret {name}, which the installation does not create")
    return problems


def _training_cluster_problems(by_kind: dict[str, dict[str, dict]]) -> list[str]:
    """The Dask training cluster, where installed: workers of one thread whose numba uses one
    thread too (one stratum per CPU), and a scheduler Service on the port the job names."""
    worker = by_kind.get("Deployment", {}).get("ordrec-dask-worker")
    if worker is None:
        return []
    problems = []
    container = worker["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if _flag(container.get("args", []), "--nthreads") != "1" or env.get("NUMBA_NUM_THREADS") != "1":
        problems.append("ordrec-dask-worker: --nthreads=1 and NUMBA_NUM_THREADS=1 (one CPU per worker)")
    service = by_kind.get("Service", {}).get("ordrec-dask-scheduler")
    if service is None or 8786 not in {p["port"] for p in service["spec"]["ports"]}:
        problems.append("ordrec-dask-worker needs the Service ordrec-dask-scheduler on port 8786")
    return problems


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")), None)


def _metrics_problems(template: dict, container: dict) -> list[str]:
    """The image binds metrics to loopback; a pod must choose the pod's address on purpose, on
    the port Prometheus is told to scrape (one process per pod: one metrics port)."""
    args = container.get("args", [])
    problems = []
    if _flag(args, "--metrics-host") != "0.0.0.0":
        problems.append("ordrec-serve: pass --metrics-host=0.0.0.0, or the scraper cannot reach /metrics")
    port = _flag(args, "--metrics-port")
    annotated = template.get("metadata", {}).get("annotations", {}).get("prometheus.io/port")
    declared = {str(p["containerPort"]) for p in container.get("ports", []) if p.get("name") == "metrics"}
    if port is None or annotated != port or declared != {port}:
        problems.append(
            f"ordrec-serve: --metrics-port ({port}), the prometheus.io/port annotation ({annotated}) "
            f"and the container port named metrics ({', '.join(sorted(declared)) or 'none'}) must agree"
        )
    if _flag(args, "--processes") != "1":
        problems.append("ordrec-serve: --processes=1 (a CPU quota, not a cpuset; one metrics port per pod)")
    return problems


def _pod_problems(where: str, pod: dict) -> list[str]:
    problems = []
    if not pod.get("securityContext", {}).get("runAsNonRoot"):
        problems.append(f"{where}: securityContext.runAsNonRoot must be true")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        ctx = c.get("securityContext", {})
        if not ctx.get("readOnlyRootFilesystem"):
            problems.append(f"{where}/{c['name']}: readOnlyRootFilesystem must be true")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}/{c['name']}: allowPrivilegeEscalation must be false")
        resources = c.get("resources", {})
        for part in ("requests", "limits"):
            for what in ("cpu", "memory"):
                if what not in resources.get(part, {}):
                    problems.append(f"{where}/{c['name']}: resources.{part}.{what} is missing")
    return problems


def check(folder: Path) -> list[str]:
    objects, how = render(folder)
    complete = folder.parent.name == "overlays"
    problems = schema_problems(objects) + policy_problems(objects, complete)
    print(
        f"{folder.relative_to(ROOT)}: {len(objects)} objects rendered with {how}, "
        f"validated against Kubernetes {', '.join(KUBERNETES_VERSIONS)}: "
        f"{'ok' if not problems else f'{len(problems)} problem(s)'}"
    )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    problems = []
    for folder in targets():
        problems += check(folder)
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
