"""The deployment recipes. The container recipes (Dockerfile: CPU; docker/Dockerfile.cuda) install
what pyproject says, copy every source the package is built from, run the README's first command
as a user that is not root, and keep a user's runs and secrets out of the build context; where a
container engine answers, the CPU image is built and runs ``--version``, without one (CI) the
recipes are checked as text, instruction by instruction. The cluster recipes (deploy/ray-up.yaml,
validated against Ray's own cluster-launcher schema; deploy/kuberay-raycluster.yaml) run the Ray
orchard pins with its token auth on, and docs/cluster.md points at each."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = [ROOT / "Dockerfile", ROOT / "docker" / "Dockerfile.cuda"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip() if " " in line.strip() else "")
            for line in text.splitlines() if line.strip()]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tested_torch() -> str:
    """The torch release CI tests (pyproject: "tested with X"), inside the extras' torch range."""
    from packaging.specifiers import SpecifierSet

    text = (ROOT / "pyproject.toml").read_text()
    tested = re.search(r"tested with ([\d.]+)", text).group(1)
    assert tested in SpecifierSet(re.search(r'"torch(>=[\d.]+,<[\d.]+)"', text).group(1))
    return tested


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_the_recipe_installs_pyprojects_torch_and_the_package_from_its_own_sources(recipe):
    steps = instructions(recipe)
    assert steps[0][0] == "FROM" and "python:3.1" in steps[0][1]
    torch_pin = f"torch=={_tested_torch()}"
    runs = [args for kind, args in steps if kind == "RUN"]
    torch_step = next(i for i, r in enumerate(runs) if "pip install" in r and "torch" in r)
    assert torch_pin in runs[torch_step] and "--index-url" in runs[torch_step]  # from PyTorch's own index
    # the package with every workload's extra (the README's first command is flower's)
    package_step = next(i for i, r in enumerate(runs) if re.search(r'pip install (--no-cache-dir )?"\.\[all\]"', r))
    assert torch_step < package_step  # torch first, so `pip install ".[all]"` keeps that build
    # every source the package is built from is copied before it is installed, and exists here
    copied = {src for kind, args in steps if kind == "COPY" for src in args.split()[:-1]}
    packages = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = {p.rstrip("*") for p in packages} | {"pyproject.toml", "README.md", "conf"}
    assert needed <= copied, needed - copied
    assert all((ROOT / src).exists() for src in copied), copied
    assert (ROOT / "orchard" / "conf").resolve() == (ROOT / "conf").resolve()  # the link the package follows


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_the_recipe_runs_the_readmes_first_command_as_a_user_that_is_not_root(recipe):
    steps = dict(instructions(recipe))  # the last of each kind is the one that counts
    assert steps["USER"] not in ("root", "0")
    assert json.loads(steps["ENTRYPOINT"]) == ["python", "-m", "orchard"]
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"python -m orchard (workload=flower strategy=ring)\s*$", readme, re.M)
    assert first and json.loads(steps["CMD"]) == first.group(1).split()
    assert steps["WORKDIR"] == "/runs"  # the store and outputs/ land in the mounted folder


def test_a_users_runs_and_secrets_stay_out_of_the_build_context():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".env", ".env.*", "*.db", "outputs", ".git"} <= ignored


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.slow
def test_the_cpu_image_builds_and_runs_orchard():
    if not _engine_answers():
        pytest.skip("no container engine answers here (docker info): the recipes are checked as text above")
    built = subprocess.run(["docker", "build", "-q", "-t", "orchard-test", str(ROOT)], capture_output=True,
                           text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run(["docker", "run", "--rm", "orchard-test", "--version"], capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0 and "orchard" in ran.stdout, ran.stdout + ran.stderr


def _pinned_ray() -> str:
    ray = next(d for d in _pyproject()["project"]["dependencies"] if d.startswith("ray["))
    return ray.split("==")[1]


def test_the_ray_up_yaml_is_valid_for_rays_launcher_and_starts_every_node_with_the_token():
    import jsonschema
    import ray.autoscaler
    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "ray-up.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)  # what `ray up` checks first
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    # and keeps idle workers a minute, as orchard's embedded Ray does (orchard.cluster.IDLE_WORKER_KEEP_MS)
    from orchard.cluster import IDLE_WORKER_KEEP_MS

    assert all(f"RAY_idle_worker_killing_time_threshold_ms={IDLE_WORKER_KEEP_MS} " in c for c in starts if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in " ".join(config["head_start_ray_commands"])
    setup = " ".join(config["setup_commands"])
    torch_pin = f"torch=={_tested_torch()}"
    assert '"orchard[all] @ ' in setup  # every workload's packages
    assert torch_pin in setup and "--index-url" in setup and "chmod 600 ~/.ray/auth_token" in setup


def test_the_kuberay_cluster_runs_orchards_ray_with_the_token_from_a_secret():
    import yaml

    from orchard.cluster import IDLE_WORKER_KEEP_MS

    cluster = yaml.safe_load((ROOT / "deploy" / "kuberay-raycluster.yaml").read_text())
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    spec = cluster["spec"]
    assert spec["rayVersion"] == _pinned_ray()
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    pods = [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]
    for pod in pods:
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["RAY_AUTH_MODE"] == "token"
            assert env["RAY_idle_worker_killing_time_threshold_ms"] == str(IDLE_WORKER_KEEP_MS)
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            token_dir = str(Path(env["RAY_AUTH_TOKEN_PATH"]).parent)
            assert mounts[token_dir] in secrets  # the token comes from a Secret, not the image
            assert "command" not in container  # KubeRay's generated `ray start` must run
            assert container["resources"]["limits"]["cpu"]
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_the_cluster_docs_point_at_every_recipe():
    docs = (ROOT / "docs" / "cluster.md").read_text()
    for recipe in ("Dockerfile", "docker/Dockerfile.cuda", "deploy/ray-up.yaml", "deploy/kuberay-raycluster.yaml"):
        assert f"`{recipe}`" in docs or f"({'../' + recipe})" in docs, recipe
