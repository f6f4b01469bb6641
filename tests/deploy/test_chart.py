"""The Helm chart in deploy/helm/berth: rendered by the real helm binary for every values
file the project ships (deploy/helm/berth/ci/), each manifest validated strictly (unknown
fields are errors) against the Kubernetes API schemas of two versions, and the wiring
between the objects checked (ports, selectors, secrets, env references).

No cluster runs here: this proves the manifests are what the API server would accept and
that they fit together, not that berth runs on Kubernetes. Needs scripts/install-deps.sh
(helm in tests/deploy/node_modules/.helm, kubernetes-validate in .venv-deploy)."""

import base64
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "berth"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
HELM = Path(os.environ.get("BERTH_HELM", Path(__file__).parent / "node_modules" / ".helm" / "helm"))
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the
# validator carries schemas for.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]
NAMESPACE = "berth"


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory):
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run scripts/install-deps.sh")
    home = tmp_path_factory.mktemp("helm-home")
    env = dict(os.environ)
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = str(home / name.lower())
    return env


def helm(helm_env, *args):
    return subprocess.run([str(HELM), *args], env=helm_env, capture_output=True, text=True)


def render(helm_env, *args):
    """The chart's manifests for these helm arguments (-f FILE, --set K=V)."""
    result = helm(helm_env, "template", "berth", str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(helm_env, *args):
    result = helm(helm_env, "template", "berth", str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode != 0, "rendering should have failed"
    return result.stderr


def one(docs, kind, component=None):
    found = [
        doc
        for doc in docs
        if doc["kind"] == kind
        and (component is None or doc["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects for {component}"
    return found[0]


def container(workload):
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def port_number(c, name_or_number):
    if isinstance(name_or_number, int):
        return name_or_number
    return next(p["containerPort"] for p in c["ports"] if p["name"] == name_or_number)


@pytest.fixture(scope="session", params=VALUES_FILES, ids=lambda p: p.stem)
def rendered(request, helm_env):
    return request.param, render(helm_env, "-f", str(request.param))


def test_the_project_ships_the_values_files_ci_renders():
    names = {p.name for p in VALUES_FILES}
    assert {"external-postgres-values.yaml", "dev-postgres-values.yaml", "production-values.yaml"} <= names


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(rendered, version):
    _, docs = rendered
    problems = []
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{name} is invalid for Kubernetes {version}: {err.message} at {list(err.path)}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{name}: no schema for Kubernetes {version}: {err}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_validator_rejects_a_broken_manifest(helm_env, version):
    """The check above can fail: an unknown field and a wrongly typed one are refused."""
    deployment = one(render(helm_env, "-f", str(CHART / "ci" / "external-postgres-values.yaml")), "Deployment")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    container(typo)["imagePullPolicyy"] = "Always"
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "two"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


def test_lint_is_clean(helm_env):
    for values in VALUES_FILES:
        result = helm(helm_env, "lint", "--strict", str(CHART), "-f", str(values))
        assert result.returncode == 0, result.stdout + result.stderr


def test_a_database_is_required_and_only_one(helm_env):
    assert "berth needs Postgres" in render_error(helm_env)
    both = render_error(helm_env, "--set", "database.url=postgres://x@db/berth", "--set", "postgres.enabled=true")
    assert "set only one database source, not database.url and postgres.enabled" in both


def test_misspelt_values_are_refused(helm_env):
    stderr = render_error(helm_env, "--set", "postgres.enabled=true", "--set", "api.replica=3")
    assert "replica" in stderr


def test_an_ingress_needs_the_domain_of_sandbox_hosts(helm_env):
    stderr = render_error(helm_env, "--set", "postgres.enabled=true", "--set", "api.ingress.enabled=true")
    assert "api.ingress.enabled needs api.domain" in stderr
    docs = render(
        helm_env, "--set", "postgres.enabled=true", "--set", "api.ingress.enabled=true", "--set", "api.domain=sbx.test"
    )
    hosts = [rule["host"] for rule in one(docs, "Ingress")["spec"]["rules"]]
    assert hosts == ["sbx.test", "*.sbx.test"]
    with_port = render_error(
        helm_env, "--set", "postgres.enabled=true", "--set", "api.ingress.enabled=true", "--set", "api.domain=sbx.test:3000"
    )
    assert 'api.domain "sbx.test:3000" has a port' in with_port
    docs = render(helm_env, "--set", "postgres.enabled=true", "--set", "api.domain=sbx.test:3000")
    args = container(one(docs, "Deployment", "api"))["args"]
    assert args[args.index("--domain") + 1] == "sbx.test:3000"


def test_no_service_variables_shadow_berths_settings(rendered):
    """A Service named berth-api would give every pod BERTH_API_* variables."""
    _, docs = rendered
    for workload in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")):
        assert workload["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_dev_postgres_only_when_asked(helm_env):
    dev = render(helm_env, "-f", str(CHART / "ci" / "dev-postgres-values.yaml"))
    statefulset = one(dev, "StatefulSet", "postgres")
    assert container(statefulset)["image"].endswith("postgres:15")
    assert "not for production" in statefulset["metadata"]["annotations"]["berth.dev/dev-only"]
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    secret = next(d for d in dev if d["kind"] == "Secret" and d["metadata"]["name"] == "berth-postgres")
    password = base64.b64decode(secret["data"]["password"]).decode()
    url = base64.b64decode(secret["data"]["url"]).decode()
    assert url == f"postgres://berth:{password}@berth-postgres:5432/berth?sslmode=disable"

    external = render(helm_env, "-f", str(CHART / "ci" / "external-postgres-values.yaml"))
    assert not [d for d in external if d["kind"] == "StatefulSet"]
    db = next(d for d in external if d["kind"] == "Secret" and d["metadata"]["name"] == "berth-database")
    assert base64.b64decode(db["data"]["url"]).decode().startswith("postgres://berth:secret@db.internal")


def test_generated_keys_have_the_vaults_format(helm_env):
    docs = render(helm_env, "--set", "postgres.enabled=true")
    keys = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "berth-keys")
    assert keys["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    version, key = base64.b64decode(keys["data"]["kek"]).decode().split(":")
    assert version == "1" and len(base64.b64decode(key)) == 32
    assert len(base64.b64decode(keys["data"]["node-token"])) == 64


def test_existing_secrets_are_used_and_none_generated(helm_env):
    docs = render(helm_env, "-f", str(CHART / "ci" / "production-values.yaml"))
    assert not [d for d in docs if d["kind"] == "Secret"]
    env = {e["name"]: e for e in container(one(docs, "Deployment"))["env"]}
    assert env["BERTH_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "berth-db", "key": "connection-url"}
    assert env["BERTH_KEK"]["valueFrom"]["secretKeyRef"] == {"name": "berth-keys", "key": "kek"}


def test_every_secret_referenced_is_rendered_or_the_operators(rendered):
    path, docs = rendered
    values = yaml.safe_load(path.read_text())
    operators = {
        values.get("database", {}).get("existingSecret"),
        values.get("secrets", {}).get("existingSecret"),
    } - {None, ""}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    for workload in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")):
        spec = workload["spec"]["template"]["spec"]
        refs = [
            (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for c in spec["containers"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        ]
        refs += [
            (v["secret"]["secretName"], item["key"])
            for v in spec.get("volumes", [])
            if "secret" in v
            for item in v["secret"]["items"]
        ]
        for name, key in refs:
            if name in operators:
                continue
            assert name in secrets, f"{workload['metadata']['name']} reads Secret {name}, which is not rendered"
            assert key in secrets[name]["data"], f"Secret {name} has no key {key}"


def test_every_variable_an_argument_names_is_defined(rendered):
    """Kubernetes leaves an undefined $(VAR) in args as literal text: berth would get it."""
    _, docs = rendered
    for workload in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet")):
        c = container(workload)
        defined = {e["name"] for e in c.get("env", [])}
        for arg in c.get("args", []):
            for name in re.findall(r"\$\(([A-Z_]+)\)", arg):
                assert name in defined, f"{workload['metadata']['name']}: $({name}) in args is not in env"


def test_api_probes_service_pdb_and_scrape_annotations_fit_together(rendered):
    _, docs = rendered
    deployment = one(docs, "Deployment", "api")
    c = container(deployment)
    args = c["args"]
    assert args[:2] == ["api", "--listen"]
    listen_port = int(args[2].rsplit(":", 1)[1])
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert port_number(c, c[probe]["httpGet"]["port"]) == listen_port
    service = one(docs, "Service", "api")
    assert port_number(c, service["spec"]["ports"][0]["targetPort"]) == listen_port
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    pdb = one(docs, "PodDisruptionBudget", "api")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert_scrapes_its_metrics_port(deployment)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def assert_scrapes_its_metrics_port(workload):
    c = container(workload)
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    port = int(annotations["prometheus.io/port"])
    assert port == port_number(c, "metrics")
    listen = c["args"][c["args"].index("--metrics-listen") + 1]
    assert listen == f"0.0.0.0:{port}"


def test_node_daemonset_has_exactly_the_stated_privileges(rendered):
    _, docs = rendered
    daemonset = one(docs, "DaemonSet", "node")
    spec = daemonset["spec"]["template"]["spec"]
    c = container(daemonset)
    assert c["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert spec["hostNetwork"] is False and spec["hostPID"] is False and spec["hostIPC"] is False
    assert spec["automountServiceAccountToken"] is False
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["state"]["mountPath"] == "/var/lib/berth"
    assert mounts["state"]["mountPropagation"] == "Bidirectional"
    assert volumes["state"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert mounts["dev"]["mountPath"] == "/dev" and volumes["dev"]["hostPath"]["path"] == "/dev"
    host_paths = sorted(v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v)
    assert host_paths == sorted([volumes["state"]["hostPath"]["path"], "/dev"])
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"]


def test_node_advertises_its_pod_address_and_probes_its_listener(rendered):
    _, docs = rendered
    c = container(one(docs, "DaemonSet", "node"))
    args = c["args"]
    assert args[0] == "node"
    listen_port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
    assert args[args.index("--advertise-url") + 1] == f"http://$(POD_IP):{listen_port}"
    assert args[args.index("--node-name") + 1] == "$(NODE_NAME)"
    assert args[args.index("--state-dir") + 1] == "/var/lib/berth"
    assert args[args.index("--node-token-file") + 1] == "/etc/berth/node-token"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert port_number(c, c[probe]["httpGet"]["port"]) == listen_port
    assert_scrapes_its_metrics_port(one(docs, "DaemonSet", "node"))


def test_only_api_pods_reach_the_node_port(rendered):
    path, docs = rendered
    values = yaml.safe_load(path.read_text())
    node_to_node = values.get("networkPolicy", {}).get("nodeToNode", False)
    daemonset = one(docs, "DaemonSet", "node")
    node_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    api_labels = one(docs, "Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    c = container(daemonset)
    listen_port = int(c["args"][c["args"].index("--listen") + 1].rsplit(":", 1)[1])
    policy = one(docs, "NetworkPolicy", "node")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= node_labels.items()
    rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == listen_port for p in r["ports"])]
    assert len(rules) == 1
    peers = rules[0]["from"]
    assert all(set(p) == {"podSelector"} for p in peers), "no namespace or ipBlock peer may reach the node port"
    selected = [p["podSelector"]["matchLabels"] for p in peers]
    assert any(s.items() <= api_labels.items() for s in selected)
    assert not any(s.items() <= node_labels.items() for s in selected) or node_to_node
