"""requirements.lock: the exact versions of Greenlight's runtime dependencies that the tests ran
with, read from the environment they ran in, so the container installs those and no others.

`python -m tests.lock > requirements.lock` writes it; tests/test_release.py fails when the file
and the environment disagree.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# The image serves every model provider: a platform team picks the model by a setting.
IMAGE_EXTRAS = ("anthropic", "openai", "ollama")
HEADER = (
    "# The versions of Greenlight's runtime dependencies (all model providers) the tests ran\n"
    "# with. Written by `python -m tests.lock > requirements.lock`; the Dockerfile installs it.\n"
)


def project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["project"])


def runtime_requirements(extras: tuple[str, ...] = IMAGE_EXTRAS) -> list[Requirement]:
    """pyproject's dependencies and those of `extras` (not the test or bench extras)."""
    proj = project()
    optional: dict[str, list[str]] = proj["optional-dependencies"]  # type: ignore[assignment]
    lines: list[str] = list(proj["dependencies"])  # type: ignore[call-overload]
    for extra in extras:
        lines += optional[extra]
    return [Requirement(line) for line in lines]


def closure(requirements: list[Requirement]) -> dict[str, str]:
    """Every installed distribution the requirements pull in, with its version."""
    found: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = metadata.distribution(req.name)
        found[name] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append((sub, frozenset(sub.extras)))
    return found


def render() -> str:
    pins = closure(runtime_requirements())
    pins.pop("greenlight", None)  # the project itself is installed from its wheel
    return HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


if __name__ == "__main__":
    sys.stdout.write(render())
