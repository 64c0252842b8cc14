#!/usr/bin/env python3
"""Renders the Helm chart with Helm's own engine and validates the result.

Run by scripts/deploy-check.sh with the Python of .tools/deploy (where
helm-python-sdk, kubernetes-validate and PyYAML are installed). Checks:

- `helm lint` finds no errors;
- each scenario below renders, and every object validates (strict) against
  the Kubernetes schemas of kubernetes-validate; the ServiceMonitor (a CRD,
  not in those schemas) is checked against the fields it must have;
- the rendered objects keep the promises of docs/deploy.md: without the shared
  store a single replica, Recreate and the data volume; with it (scale-out,
  replicaCount 3) RollingUpdate, the store's URL and keys from Secrets, the
  replica named after its pod, a per-pod cache, anti-affinity and a PDB; in
  both, probes, security context, GPU resource, metrics token wiring;
- replicaCount=2 (and 3) fails to render without the shared store, with the
  message that says it needs it; an incomplete shared store fails too.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "tensor-wasm"
BIN = Path(sys.executable).parent

SCENARIOS: dict[str, dict] = {
    "default (GPU)": {},
    "cpu, no persistence, no pdb": {
        "gpu": {"enabled": False},
        "persistence": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
    },
    "servicemonitor, runtimeClass, extra config": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "runtimeClassName": "nvidia",
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "config": {"env": {"TENSOR_WASM_MAX_INSTANCES": 128, "TENSOR_WASM_FUEL": True}},
        "persistence": {"storageClass": "fast", "size": "50Gi"},
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "otel traces to a collector": {
        "otel": {
            "endpoint": "http://otel-collector.observability:4318",
            "sampler": "traceidratio",
            "samplerArg": 0.25,
            "resourceAttributes": "deployment.environment=prod",
            "headersSecret": {"name": "otlp-auth", "key": "headers"},
        },
    },
    "existing secret and claim, metrics token off": {
        "persistence": {"existingClaim": "my-data"},
        "metrics": {"token": {"enabled": False}},
        "replicaCount": 0,
    },
    "existing metrics secret + servicemonitor": {
        "metrics": {
            "token": {"existingSecret": "prom-token", "secretKey": "bearer"},
            "serviceMonitor": {"enabled": True},
        },
    },
    "shared store, 3 replicas": {
        "replicaCount": 3,
        "sharedStore": {
            "enabled": True,
            "database": {"url": "postgres://tw:secret@postgres.db:5432/tensorwasm"},
            "blobStore": {
                "url": "s3://tensor-wasm/prod",
                "endpoint": "http://seaweedfs.storage:8333",
                "allowHttp": True,
                "credentials": {"accessKeyId": "tw", "secretAccessKey": "secret"},
            },
        },
    },
    "shared store, existing secrets, required anti-affinity, cpu": {
        "replicaCount": 2,
        "gpu": {"enabled": False},
        "sharedStore": {
            "enabled": True,
            "database": {"existingSecret": "tw-db", "secretKey": "dsn"},
            "blobStore": {
                "url": "s3://tensor-wasm",
                "credentials": {"existingSecret": "tw-s3"},
            },
            "antiAffinity": "required",
        },
    },
    "shared store, pod identity for S3, no anti-affinity": {
        "replicaCount": 4,
        "sharedStore": {
            "enabled": True,
            "database": {"url": "postgres://tw@postgres.db/tensorwasm"},
            "blobStore": {"url": "s3://tensor-wasm/p"},
            "antiAffinity": "",
        },
    },
}

# Values the chart must refuse, and a word the refusal must contain.
REFUSED: dict[str, tuple[dict, str]] = {
    "replicaCount=2 without the shared store": ({"replicaCount": 2}, "sharedStore.enabled"),
    "replicaCount=3 without the shared store": ({"replicaCount": 3}, "sharedStore.enabled"),
    "shared store without a blob store": (
        {"replicaCount": 2, "sharedStore": {"enabled": True, "database": {"url": "postgres://x/y"}}},
        "blobStore.url",
    ),
    "shared store without a database": (
        {"sharedStore": {"enabled": True, "blobStore": {"url": "s3://b"}}},
        "database.url",
    ),
    "shared store with half the keys": (
        {
            "sharedStore": {
                "enabled": True,
                "database": {"url": "postgres://x/y"},
                "blobStore": {"url": "s3://b", "credentials": {"accessKeyId": "k"}},
            }
        },
        "both accessKeyId and secretAccessKey",
    ),
}

SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": {"type": "object", "minProperties": 1}},
                },
                "namespaceSelector": {"type": "object"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port", "path", "authorization"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"const": "/metrics"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "authorization": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["type", "credentials"],
                                "properties": {
                                    "type": {"const": "Bearer"},
                                    "credentials": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["name", "key"],
                                        "properties": {
                                            "name": {"type": "string", "minLength": 1},
                                            "key": {"type": "string", "minLength": 1},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print(f"FAIL {msg}", file=sys.stderr)


def expect(cond: bool, scenario: str, msg: str) -> None:
    if not cond:
        fail(f"[{scenario}] {msg}")


def render(chart: helm.Chart, values: dict) -> dict[str, str]:
    return chart.render(values, name="tw", namespace="tensor-wasm", is_install=True)


def objects(manifests: dict[str, str]) -> list[dict]:
    out = []
    for path, text in sorted(manifests.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def validate(scenario: str, objs: list[dict], tmp: Path) -> None:
    files = []
    for i, obj in enumerate(objs):
        if obj.get("kind") == "ServiceMonitor":
            try:
                jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
            except jsonschema.ValidationError as e:
                fail(f"[{scenario}] ServiceMonitor: {e.message} at {list(e.absolute_path)}")
            continue
        f = tmp / f"{i:02d}-{obj['kind'].lower()}.yaml"
        f.write_text(yaml.safe_dump(obj))
        files.append(str(f))
    if not files:
        fail(f"[{scenario}] rendered no objects")
        return
    run = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "--quiet", *files],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        fail(f"[{scenario}] kubernetes-validate:\n{run.stdout}{run.stderr}")


def check_promises(scenario: str, values: dict, objs: list[dict]) -> None:
    by_kind: dict[str, list[dict]] = {}
    for obj in objs:
        by_kind.setdefault(obj["kind"], []).append(obj)
    deps = by_kind.get("Deployment", [])
    expect(len(deps) == 1, scenario, "exactly one Deployment")
    if not deps:
        return
    dep = deps[0]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    shared = values.get("sharedStore", {})
    if shared.get("enabled"):
        check_shared_store(scenario, values, spec, by_kind)
    else:
        expect(spec["replicas"] in (0, 1), scenario, f"replicas {spec['replicas']} not 0/1")
        expect(spec["strategy"] == {"type": "Recreate"}, scenario, "strategy is not Recreate")
    psc = pod["securityContext"]
    expect(psc.get("runAsNonRoot") is True, scenario, "pod runAsNonRoot")
    (container,) = pod["containers"]
    sc = container["securityContext"]
    expect(sc.get("readOnlyRootFilesystem") is True, scenario, "readOnlyRootFilesystem")
    expect(sc.get("allowPrivilegeEscalation") is False, scenario, "allowPrivilegeEscalation")
    expect(sc.get("capabilities", {}).get("drop") == ["ALL"], scenario, "drop ALL capabilities")
    expect(container["livenessProbe"]["httpGet"]["path"] == "/healthz", scenario, "liveness /healthz")
    expect(container["readinessProbe"]["httpGet"]["path"] == "/readyz", scenario, "readiness /readyz")
    env = {e["name"]: e for e in container["env"]}
    expect(env["TENSOR_WASM_DATA_DIR"]["value"] == "/data", scenario, "data dir /data")
    expect(
        any(m["mountPath"] == "/data" for m in container["volumeMounts"]),
        scenario,
        "/data is mounted",
    )
    grace = int(env["TENSOR_WASM_SHUTDOWN_GRACE_S"]["value"])
    expect(pod["terminationGracePeriodSeconds"] > grace, scenario, "termination grace > server grace")
    gpu = values.get("gpu", {}).get("enabled", True)
    limits = container.get("resources", {}).get("limits", {})
    expect(("nvidia.com/gpu" in limits) == gpu, scenario, "nvidia.com/gpu limit iff gpu.enabled")
    expect(
        env["TENSOR_WASM_DEVICE"]["value"] == ("cuda" if gpu else "cpu"), scenario, "device"
    )
    expect(container["image"].endswith("-cpu") != gpu, scenario, "image tag variant")
    if values.get("runtimeClassName"):
        expect(pod.get("runtimeClassName") == values["runtimeClassName"], scenario, "runtimeClassName")
    volume = next(v for v in pod["volumes"] if v["name"] == "data")
    persistence = values.get("persistence", {})
    if shared.get("enabled"):
        expect("emptyDir" in volume and not by_kind.get("PersistentVolumeClaim"), scenario,
               "with the shared store the data dir is a per-pod emptyDir, no claim")
    elif persistence.get("enabled", True):
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        names = [o["metadata"]["name"] for o in by_kind.get("PersistentVolumeClaim", [])]
        if persistence.get("existingClaim"):
            expect(claim == persistence["existingClaim"] and not names, scenario, "existing claim")
        else:
            expect(claim in names, scenario, "data volume is the chart's PVC")
    else:
        expect("emptyDir" in volume, scenario, "emptyDir without persistence")
    token = values.get("metrics", {}).get("token", {})
    if token.get("enabled", True):
        ref = env["TENSOR_WASM_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
        secrets = {o["metadata"]["name"]: o for o in by_kind.get("Secret", [])}
        if token.get("existingSecret"):
            expect(ref["name"] == token["existingSecret"] and not secrets, scenario, "existing secret")
        else:
            expect(ref["name"] in secrets, scenario, "metrics token env comes from the chart's Secret")
            if ref["name"] in secrets:
                expect(ref["key"] in secrets[ref["name"]]["data"], scenario, "secret has the key")
        for sm in by_kind.get("ServiceMonitor", []):
            cred = sm["spec"]["endpoints"][0]["authorization"]["credentials"]
            expect(cred == {"name": ref["name"], "key": ref["key"]}, scenario,
                   "ServiceMonitor bearer token is the server's metrics token")
    else:
        expect("TENSOR_WASM_METRICS_TOKEN" not in env, scenario, "no metrics token env")
    otel = values.get("otel", {})
    if otel.get("endpoint"):
        expect(env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == otel["endpoint"], scenario,
               "OTLP endpoint")
        expect(env["OTEL_TRACES_SAMPLER_ARG"]["value"] == str(otel.get("samplerArg", "1.0")),
               scenario, "sampler ratio")
        expect(env["TENSOR_WASM_OTEL_TRUST_REMOTE_SAMPLED"]["value"] == "false", scenario,
               "a caller's sampled flag is not trusted by default")
        if otel.get("headersSecret", {}).get("name"):
            ref = env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"]
            expect(ref == otel["headersSecret"], scenario, "OTLP headers from the Secret")
    else:
        expect(not any(name.startswith("OTEL_") for name in env), scenario,
               "no OTEL_ variables unless an endpoint is set")
    wants_sm = values.get("metrics", {}).get("serviceMonitor", {}).get("enabled", False)
    expect(bool(by_kind.get("ServiceMonitor")) == wants_sm, scenario, "ServiceMonitor iff enabled")
    wants_pdb = values.get("podDisruptionBudget", {}).get("enabled", True)
    expect(bool(by_kind.get("PodDisruptionBudget")) == wants_pdb, scenario, "PDB iff enabled")
    expect(len(by_kind.get("Service", [])) == 1, scenario, "one Service")


def check_shared_store(scenario: str, values: dict, spec: dict, by_kind: dict) -> None:
    """The scale-out promises of docs/deploy.md for a Deployment over the shared store."""
    shared = values["sharedStore"]
    expect(spec["replicas"] == values.get("replicaCount", 1), scenario, "replicas as asked")
    expect(spec["strategy"]["type"] == "RollingUpdate", scenario, "strategy is RollingUpdate")
    expect(spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, scenario,
           "rolling update keeps capacity")
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    secrets = {o["metadata"]["name"]: o for o in by_kind.get("Secret", [])}
    db = shared["database"]
    ref = env["TENSOR_WASM_STORE"]["valueFrom"]["secretKeyRef"]
    expect("value" not in env["TENSOR_WASM_STORE"], scenario, "the database URL is not inline")
    if db.get("existingSecret"):
        expect(ref == {"name": db["existingSecret"], "key": db.get("secretKey", "url")}, scenario,
               "database URL from the existing Secret")
    else:
        expect(ref["name"] in secrets and ref["key"] in secrets[ref["name"]]["data"], scenario,
               "database URL from the chart's Secret")
    blob = shared["blobStore"]
    expect(env["TENSOR_WASM_BLOB_STORE"]["value"] == blob["url"], scenario, "blob store URL")
    expect(env["TENSOR_WASM_REPLICA_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name",
           scenario, "the replica is named after its pod")
    expect(("AWS_ENDPOINT" in env) == bool(blob.get("endpoint")), scenario, "AWS_ENDPOINT iff set")
    expect(("AWS_ALLOW_HTTP" in env) == bool(blob.get("allowHttp")), scenario, "AWS_ALLOW_HTTP iff set")
    creds = blob.get("credentials", {})
    has_keys = bool(creds.get("existingSecret") or creds.get("accessKeyId"))
    expect(("AWS_ACCESS_KEY_ID" in env) == has_keys, scenario, "object store keys iff given")
    if has_keys:
        key_ref = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
        if creds.get("existingSecret"):
            expect(key_ref["name"] == creds["existingSecret"], scenario, "keys from the existing Secret")
        else:
            expect(key_ref["name"] in secrets and key_ref["key"] in secrets[key_ref["name"]]["data"],
                   scenario, "keys from the chart's Secret")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    mode = shared.get("antiAffinity", "preferred")
    wanted = {
        "required": "requiredDuringSchedulingIgnoredDuringExecution",
        "preferred": "preferredDuringSchedulingIgnoredDuringExecution",
    }.get(mode)
    expect((wanted in anti) if wanted else not anti, scenario, f"anti-affinity {mode or 'none'}")
    annotations = spec["template"]["metadata"].get("annotations", {})
    expect("checksum/store" in annotations, scenario, "pods roll when the store's Secret changes")
    if values.get("podDisruptionBudget", {}).get("enabled", True):
        (pdb,) = by_kind.get("PodDisruptionBudget", [{}])
        expect(pdb.get("spec", {}).get("maxUnavailable") == 1, scenario, "PDB keeps all but one")


def main() -> int:
    lint = helm.lint(str(CHART))
    for err in lint.get("errors", []):
        fail(f"helm lint: {err}")
    for msg in lint.get("messages", []):
        if msg.get("severity", 0) >= 2:  # 1 info, 2 warning, 4 error
            fail(f"helm lint: {msg}")
    with helm.Chart.load(str(CHART)) as chart, tempfile.TemporaryDirectory() as tmp:
        for i, (scenario, values) in enumerate(SCENARIOS.items()):
            try:
                objs = objects(render(chart, values))
            except helm.HelmError as e:
                fail(f"[{scenario}] render failed: {e}")
                continue
            sub = Path(tmp) / str(i)
            sub.mkdir()
            before = len(failures)
            validate(scenario, objs, sub)
            check_promises(scenario, values, objs)
            if len(failures) == before:
                print(f"ok   [{scenario}] {len(objs)} objects: "
                      + ", ".join(sorted(o["kind"] for o in objs)))
        for name, (values, word) in REFUSED.items():
            try:
                render(chart, values)
                fail(f"[{name}] rendered; the chart must refuse it")
            except helm.HelmError as e:
                if word not in str(e):
                    fail(f"[{name}] failed for another reason: {e}")
                else:
                    print(f"ok   [{name}] refused: {str(e).split(': ', 1)[-1][:90]}...")
    if failures:
        print(f"deploy_check: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print(f"chart: helm SDK {helm.helm_sdk_version()}, lint clean, all scenarios valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
