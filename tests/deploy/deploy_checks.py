#!/usr/bin/env python3
"""Static checks of deploy/ that need no cluster, container engine or network
(run by tools/validate_deploy.sh; not a test by itself).

- Kubernetes manifests (deploy/k8s/**, every kustomization and its overlays
  rendered): built-in kinds against the Kubernetes OpenAPI schemas bundled in
  the PyPI package kubernetes-validate (strict: unknown fields fail), for the
  oldest and newest Kubernetes versions supported; CRDs (InferencePool,
  PodMonitor, PrometheusRule, HTTPRoute) and Kustomization against the
  hand-written subset schemas in tests/deploy/schemas/.
- The contracts between the files and kvserve's source: every kvserve flag
  used is registered in cli/cli_serve.cc or cli/engine_flags.cc; gRPC probes ask for the health service
  names server/daemon.cc registers; grace periods cover preStop + drain +
  the gRPC close grace; InferencePool / PodMonitor / Service / EPP point at
  ports and labels that exist.
- Metric names: every kvserve_* series in the Grafana dashboard, the alert
  rules and the endpoint picker's flags is one that kvserve registers
  (string literals in the C++ source, histograms expanded to
  _bucket/_sum/_count), and, given --metrics-file (a live /metrics scrape),
  every kvserve_* family scraped is known to that source scan.
- deploy/k8s/prometheusrule.yaml is exactly the rules of
  deploy/prometheus/kvserve-alerts.yaml (--write-prometheusrule rewrites it).

Prints PASS/FAIL lines; exits 1 when any check fails.
"""
import argparse
import copy
import glob
import json
import os
import re
import shlex
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSIONS = ("1.31", "1.37")  # oldest and newest supported
SOURCE_DIRS = ("cli", "common", "engine", "kvcache", "models", "scheduler",
               "server")
METRIC_RE = re.compile(r"\bkvserve_[a-z0-9_]+\b")


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}")
        return ok


# ---------------------------------------------------------------- source facts

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def source_files(src):
    for d in SOURCE_DIRS:
        for ext in ("cc", "h"):
            yield from glob.glob(os.path.join(src, d, "**", f"*.{ext}"),
                                 recursive=True)


def known_series(src):
    """Series names kvserve can expose, from its C++ string literals."""
    names, hists = set(), set()
    for path in source_files(src):
        text = read(path)
        names.update(re.findall(r'"(kvserve_[a-z0-9_]+)"', text))
        # The GIE model-server protocol's names (engine_metrics.cc).
        names.update(re.findall(r'"(vllm:[a-z0-9_]+)"', text))
        hists.update(re.findall(r'hist\(\s*"(kvserve_[a-z0-9_]+)"', text))
        hists.update(re.findall(
            r'BuildHistogram\(\)\s*\.Name\(\s*"(kvserve_[a-z0-9_]+)"', text))
    series = set(names)
    for h in hists:
        series.update({h + "_bucket", h + "_sum", h + "_count"})
    return series


def serve_flags(src):
    """Flag names `kvserve serve` accepts (--no-X for booleans too)."""
    text = "".join(read(os.path.join(src, "cli", f))
                   for f in ("cli_serve.cc", "engine_flags.cc",
                             "kv_events_flags.cc"))
    flags = set()
    for kind, name in re.findall(r'args->(\w+)\(\s*"([a-z0-9-]+)"', text):
        flags.add(name)
        if kind == "Bool":
            flags.add("no-" + name)
    return flags


def health_services(src):
    text = read(os.path.join(src, "server", "daemon.cc"))
    names = set(re.findall(r'kServiceName\[\]\s*=\s*"([^"]+)"', text))
    return names | {""}


def grpc_close_grace(src):
    text = read(os.path.join(src, "server", "daemon.cc"))
    m = re.search(r"kGrpcShutdownGrace\s*=\s*absl::Seconds\((\d+)\)", text)
    return int(m.group(1)) if m else 5


def flag_values(args):
    """{'port': '50051', ...} from ['--port=50051', '--x', 'y', ...]."""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                k, v = a[2:], args[i + 1]
                i += 1
            else:
                k, v = a[2:], ""
            out[k] = v
        i += 1
    return out


def check_flags(r, where, args, flags):
    unknown = sorted(set(flag_values(args)) - flags)
    r.check(f"{where}: kvserve flags exist", not unknown,
            f"unknown flags {unknown}")


# ------------------------------------------------------------ kubernetes YAML

def load_docs(path):
    return [d for d in yaml.safe_load_all(read(path)) if d is not None]


def local_schema(schema_dir, doc):
    api = doc.get("apiVersion", "")
    group, _, version = api.rpartition("/")
    name = f"{doc.get('kind', '').lower()}-{group}-{version}.json"
    path = os.path.join(schema_dir, name)
    return json.loads(read(path)) if os.path.exists(path) else None


def validate_doc(r, schema_dir, where, doc):
    label = f"{where} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    errors = []
    for v in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            schema = local_schema(schema_dir, doc)
            if schema is None:
                errors.append(f"no schema for {doc.get('apiVersion')} "
                              f"{doc.get('kind')}")
                break
            try:
                jsonschema.Draft202012Validator(schema).validate(doc)
            except jsonschema.ValidationError as e:
                errors.append(f"{list(e.absolute_path)}: {e.message}")
            break  # local schemas are not versioned by Kubernetes release
        except kubernetes_validate.ValidationError as e:
            errors.append(f"k8s {v}: {e}")
    r.check(f"schema {label}", not errors, "; ".join(errors))


def strategic_merge(base, patch, unmatched):
    """Enough of kubectl's strategic merge for our patches: maps merge,
    lists of named maps merge by name, other lists are replaced. Names in
    the patch that the base lacks go to `unmatched` (likely typos)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, unmatched) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch and
            all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [copy.deepcopy(x) for x in base]
        for item in patch:
            for i, b in enumerate(out):
                if b["name"] == item["name"]:
                    out[i] = strategic_merge(b, item, unmatched)
                    break
            else:
                unmatched.append(item["name"])
                out.append(item)
        return out
    return copy.deepcopy(patch)


def render(r, schema_dir, kdir, seen_patches):
    """The documents `kubectl apply -k kdir` would create (namespace and
    image settings aside)."""
    path = os.path.join(kdir, "kustomization.yaml")
    k = load_docs(path)[0]
    validate_doc(r, schema_dir, os.path.relpath(path), k)
    docs = []
    for res in k.get("resources", []):
        p = os.path.normpath(os.path.join(kdir, res))
        if not r.check(f"{path}: resource {res} exists", os.path.exists(p),
                       "missing"):
            continue
        if os.path.isdir(p):
            docs += render(r, schema_dir, p, seen_patches)
        else:
            docs += load_docs(p)
    for patch in k.get("patches", []):
        p = os.path.normpath(os.path.join(kdir, patch["path"]))
        seen_patches.add(p)
        for pd in load_docs(p):
            hits = [i for i, d in enumerate(docs)
                    if d.get("kind") == pd.get("kind") and
                    d["metadata"]["name"] == pd["metadata"]["name"]]
            r.check(f"{p}: patches {pd.get('kind')}/"
                    f"{pd['metadata']['name']}", len(hits) == 1,
                    "no such resource in the base")
            for i in hits:
                unmatched = []
                docs[i] = strategic_merge(docs[i], pd, unmatched)
                r.check(f"{p}: every named list item patched exists in the "
                        f"base", not unmatched, f"new items {unmatched}")
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def container(deploy, name):
    for c in deploy["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    return None


def check_kvserve_deployment(r, where, d, src, flags):
    pod = d["spec"]["template"]["spec"]
    c = container(d, "kvserve")
    if not r.check(f"{where}: container kvserve", c is not None, "missing"):
        return None
    args = c.get("args", [])
    check_flags(r, where, args, flags)
    fv = flag_values(args)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    r.check(f"{where}: --port matches the grpc containerPort",
            str(ports.get("grpc")) == fv.get("port", "50051"),
            f"{ports.get('grpc')} vs {fv.get('port')}")
    http = fv.get("http-port", fv.get("metrics-port", "9090"))
    r.check(f"{where}: --http-port matches the http containerPort",
            str(ports.get("http")) == http, f"{ports.get('http')} vs {http}")
    r.check(f"{where}: listens beyond loopback", fv.get("host") in
            ("0.0.0.0", "::"), f"--host={fv.get('host')}")
    services = health_services(src)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c.get(probe, {})
        g = p.get("grpc")
        ok = (g is not None and g.get("port") == ports.get("grpc") and
              g.get("service", "") in services)
        r.check(f"{where}: {probe} is gRPC health on the grpc port for a "
                f"registered service", ok, f"{p} (services {services})")
    drain = float(fv.get("drain-timeout", "30"))
    pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    need = pre.get("seconds", 0) + drain + grpc_close_grace(src)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    r.check(f"{where}: terminationGracePeriodSeconds covers preStop + "
            f"drain + gRPC close", grace >= need, f"{grace} < {need}")
    sec = pod.get("securityContext", {})
    r.check(f"{where}: runs as non-root", sec.get("runAsNonRoot") is True and
            sec.get("runAsUser", 0) != 0, str(sec))
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    models = mounts.get("models", {})
    pvc = vols.get("models", {}).get("persistentVolumeClaim", {})
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    r.check(f"{where}: weights mounted read-only at KVSERVE_MODELS_DIR",
            models.get("readOnly") is True and pvc.get("readOnly") is True and
            env.get("KVSERVE_MODELS_DIR") == models.get("mountPath"),
            f"{models} {pvc} {env.get('KVSERVE_MODELS_DIR')}")
    return {"http": ports.get("http"), "labels":
            d["spec"]["template"]["metadata"]["labels"], "ports": ports}


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_stack(r, where, docs, src, flags, series):
    deploys = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    if not r.check(f"{where}: has the kvserve Deployment", "kvserve" in
                   deploys, "missing"):
        return
    info = check_kvserve_deployment(r, where, deploys["kvserve"], src, flags)
    if info is None:
        return
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    for pool in by_kind(docs, "InferencePool"):
        spec = pool["spec"]
        r.check(f"{where}: InferencePool selects the kvserve pods",
                matches(spec["selector"]["matchLabels"], info["labels"]),
                str(spec["selector"]))
        r.check(f"{where}: InferencePool targets the HTTP port (OpenAI API "
                f"and /metrics)", spec["targetPorts"][0]["number"] ==
                info["http"], str(spec["targetPorts"]))
        ref = spec["endpointPickerRef"]
        svc = services.get(ref["name"])
        r.check(f"{where}: endpointPickerRef names a Service port",
                svc is not None and ref["port"]["number"] in
                [p["port"] for p in svc["spec"]["ports"]], str(ref))
    for pm in by_kind(docs, "PodMonitor"):
        eps = pm["spec"]["podMetricsEndpoints"]
        r.check(f"{where}: PodMonitor scrapes /metrics on a pod port",
                matches(pm["spec"]["selector"]["matchLabels"],
                        info["labels"]) and
                all(e.get("port") in info["ports"] and
                    e.get("path") == "/metrics" for e in eps), str(eps))
    svc = services.get("kvserve")
    if svc is not None:
        r.check(f"{where}: Service selects the pods and named ports",
                matches(svc["spec"]["selector"], info["labels"]) and
                all(p["targetPort"] in info["ports"]
                    for p in svc["spec"]["ports"]), str(svc["spec"]))
    epp = deploys.get("kvserve-epp")
    if epp is not None:
        args = container(epp, "epp").get("args", [])
        fv = flag_values(args)
        used = {k: v for k, v in fv.items() if k.endswith("-metric") and v}
        unknown = {k: v for k, v in used.items()
                   if v.split("{")[0] not in series}
        r.check(f"{where}: endpoint picker metric flags name kvserve "
                f"metrics", not unknown, f"unknown {unknown}")
        # Without a flag the picker scrapes the protocol's vLLM names,
        # which kvserve exports too.
        defaults = {"total-queued-requests-metric":
                    "vllm:num_requests_waiting",
                    "kv-cache-usage-percentage-metric":
                    "vllm:gpu_cache_usage_perc"}
        for needed, default in defaults.items():
            r.check(f"{where}: endpoint picker's --{needed} names a served "
                    f"metric", needed in used or default in series,
                    f"{default} is not exported")


def check_precise_routing(r, where, docs, kvserve_args):
    """llm-d's precise prefix-cache scorer, where configured, reads the
    events kvserve publishes: same block size, the discovered port is the
    one kvserve binds, the topic's model seeds the same keys."""
    for cm in by_kind(docs, "ConfigMap"):
        for text in cm.get("data", {}).values():
            try:
                cfg = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if not isinstance(cfg, dict):
                continue
            for plugin in cfg.get("plugins", []):
                if plugin.get("type") != "precise-prefix-cache-scorer":
                    continue
                params = plugin.get("parameters", {})
                fv = flag_values(kvserve_args)
                block = params.get("tokenProcessorConfig", {}).get(
                    "blockSize")
                r.check(f"{where}: the scorer's blockSize is kvserve's "
                        f"--block-size", str(block) ==
                        fv.get("block-size", "16"), str(block))
                endpoint = fv.get("kv-events-endpoint", "")
                ev = params.get("kvEventsConfig", {})
                port = ev.get("podDiscoveryConfig", {}).get("socketPort")
                r.check(f"{where}: kvserve binds the events port the scorer "
                        f"dials", endpoint == f"tcp://*:{port}",
                        f"{endpoint} vs {port}")
                model = params.get("indexerConfig", {}).get(
                    "tokenizersPoolConfig", {}).get("modelName")
                topic = fv.get("kv-events-topic", "")
                r.check(f"{where}: the topic's model is the scorer's "
                        f"tokenizer model", topic.startswith(
                            ev.get("topicFilter", "kv@")) and
                        topic.split("@")[-1] == model, f"{topic} vs {model}")


def check_k8s(r, root, src, flags, series):
    schema_dir = os.path.join(src, "tests", "deploy", "schemas")
    kdirs = sorted(os.path.dirname(p) for p in glob.glob(
        os.path.join(root, "deploy", "k8s", "**", "kustomization.yaml"),
        recursive=True))
    patches, covered = set(), set()
    for kdir in kdirs:
        docs = render(r, schema_dir, kdir, patches)
        rel = os.path.relpath(kdir, root)
        for d in docs:
            validate_doc(r, schema_dir, rel, d)
        check_stack(r, rel, docs, src, flags, series)
        kv = [d for d in by_kind(docs, "Deployment")
              if d["metadata"]["name"] == "kvserve"]
        if kv:
            check_precise_routing(r, rel, docs,
                                  container(kv[0], "kvserve").get("args", []))
    for path in glob.glob(os.path.join(root, "deploy", "k8s", "**", "*.yaml"),
                          recursive=True):
        covered.add(os.path.normpath(path))
    listed = set()
    for kdir in kdirs:
        k = load_docs(os.path.join(kdir, "kustomization.yaml"))[0]
        listed.add(os.path.normpath(os.path.join(kdir, "kustomization.yaml")))
        for res in k.get("resources", []):
            listed.add(os.path.normpath(os.path.join(kdir, res)))
    orphans = sorted(covered - listed - patches)
    r.check("deploy/k8s: every YAML file is in a kustomization", not orphans,
            str(orphans))


# ----------------------------------------------- systemd, Docker, observability

def check_systemd(r, root, src, flags):
    unit = read(os.path.join(root, "deploy", "systemd", "kvserve.service"))
    env = {}
    for line in read(os.path.join(root, "deploy", "systemd",
                                  "kvserve.env")).splitlines():
        if line.strip() and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    cmd = keys["ExecStart"]
    expanded = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), "?"),
                      cmd)
    expanded = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""),
                      expanded)
    args = shlex.split(expanded)
    check_flags(r, "systemd ExecStart + kvserve.env", args[1:], flags)
    unset = sorted(set(re.findall(r"\$\{?(\w+)", cmd)) - set(env))
    r.check("systemd: every variable in ExecStart is in kvserve.env",
            not unset, str(unset))
    need = float(env["KVSERVE_DRAIN_TIMEOUT"]) + grpc_close_grace(src)
    r.check("systemd: TimeoutStopSec covers drain + gRPC close",
            float(keys["TimeoutStopSec"]) >= need,
            f"{keys['TimeoutStopSec']} < {need}")
    r.check("systemd: the models directory is read-only",
            env["KVSERVE_MODELS_DIR"] in keys.get("ReadOnlyPaths", ""),
            keys.get("ReadOnlyPaths", "missing"))
    for k, v in (("Restart", "on-failure"), ("NoNewPrivileges", "yes"),
                 ("ProtectSystem", "strict"), ("DynamicUser", "yes")):
        r.check(f"systemd: {k}={v}", keys.get(k) == v, keys.get(k, "unset"))


def check_docker(r, root, flags):
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = read(os.path.join(root, "deploy", "docker", name))
        text = re.sub(r"\\\n", " ", text)
        stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.M)
        r.check(f"{name}: multi-stage (builder + runtime)", len(stages) >= 2,
                str(stages))
        users = re.findall(r"^USER\s+(\S+)", text, re.M)
        r.check(f"{name}: runtime user is not root", users and
                users[-1].split(":")[0] not in ("0", "root"), str(users))
        r.check(f"{name}: builds with deploy/setup.sh",
                "deploy/setup.sh --apt-only" in text, "no setup.sh step")
        r.check(f"{name}: no weights in the image", not re.search(
            r"^(COPY|ADD)\s.*(weights|\.gguf|safetensors)", text, re.M),
            "COPY of weights")
        ep = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])", text,
                                  re.M).group(1))
        cmd = json.loads(re.search(r"^CMD\s+(\[.*\])", text, re.M).group(1))
        r.check(f"{name}: ENTRYPOINT is `kvserve serve`", ep[-1] == "serve",
                str(ep))
        check_flags(r, f"{name} CMD", cmd, flags)
        exposed = re.findall(r"^EXPOSE\s+(.*)$", text, re.M)
        r.check(f"{name}: exposes the default gRPC and HTTP ports",
                exposed and {"50051", "9090"} <= set(exposed[-1].split()),
                str(exposed))


def exprs_in(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                yield v
            else:
                yield from exprs_in(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from exprs_in(v)


def check_names(r, where, exprs, series, required=()):
    used = set()
    for e in exprs:
        used.update(METRIC_RE.findall(e))
    unknown = sorted(used - series)
    r.check(f"{where}: every kvserve_* series exists", used and not unknown,
            f"unknown {unknown}")
    missing = sorted(set(required) - used)
    r.check(f"{where}: shows {', '.join(required)}", not missing,
            f"missing {missing}")


def check_dashboard(r, root, series):
    path = os.path.join(root, "deploy", "grafana", "kvserve-dashboard.json")
    try:
        dash = json.loads(read(path))
    except ValueError as e:
        r.check("grafana: valid JSON", False, str(e))
        return
    r.check("grafana: valid JSON", True)
    panels = dash.get("panels", [])
    ids = [p["id"] for p in panels]
    r.check("grafana: unique panel ids", len(ids) == len(set(ids)), str(ids))
    bad = [p.get("title") for p in panels if p.get("type") != "row" and (
        not p.get("targets") or "datasource" not in p)]
    r.check("grafana: every panel has a data source and queries", not bad,
            str(bad))
    check_names(r, "grafana", exprs_in(dash), series, (
        "kvserve_kv_blocks", "kvserve_preemptions_total",
        "kvserve_prefix_cache_hits_tokens_total",
        "kvserve_time_to_first_token_seconds_bucket",
        "kvserve_inter_token_latency_seconds_bucket", "kvserve_requests",
        "kvserve_kv_token_slots", "kvserve_kv_evictions_total",
        "kvserve_kv_evicted_block_age_seconds_bucket",
        "kvserve_kv_evicted_block_reuses_bucket"))


def check_alerts(r, root, series):
    path = os.path.join(root, "deploy", "prometheus", "kvserve-alerts.yaml")
    groups = yaml.safe_load(read(path))["groups"]
    rules = [rule for g in groups for rule in g["rules"]]
    check_names(r, "alerts", (x["expr"] for x in rules), series,
                ("kvserve_preemptions_total", "kvserve_kv_cache_usage_ratio",
                 "kvserve_engine_steps_total", "kvserve_grpc_requests_total"))
    names = {x.get("alert") for x in rules}
    need = {"KvservePreemptionStorm", "KvserveKvCacheFull",
            "KvserveSchedulerStalled", "KvserveHighErrorRate"}
    r.check("alerts: storm, KV full, stall and error-rate rules",
            need <= names, f"missing {sorted(need - names)}")


PROMETHEUSRULE_HEADER = """\
# Prometheus Operator copy of deploy/prometheus/kvserve-alerts.yaml, which is
# the source: edit that file, then regenerate this one with
#   python3 tests/deploy/deploy_checks.py --write-prometheusrule
# (tools/validate_deploy.sh fails when the two differ).
"""


def prometheusrule_text(root):
    groups = yaml.safe_load(read(os.path.join(
        root, "deploy", "prometheus", "kvserve-alerts.yaml")))["groups"]
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "kvserve",
                        "labels": {"app.kubernetes.io/name": "kvserve"}},
           "spec": {"groups": groups}}

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):  # multi-line PromQL stays a literal block
        return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                       style="|" if "\n" in value else None)
    Dumper.add_representer(str, text)
    return PROMETHEUSRULE_HEADER + yaml.dump(doc, Dumper=Dumper,
                                             sort_keys=False, width=100)


def check_prometheusrule(r, root):
    path = os.path.join(root, "deploy", "k8s", "prometheusrule.yaml")
    same = (os.path.exists(path) and load_docs(path) ==
            list(yaml.safe_load_all(prometheusrule_text(root))))
    r.check("deploy/k8s/prometheusrule.yaml matches the alert rules", same,
            "regenerate: deploy_checks.py --write-prometheusrule")


def check_scrape(r, path, series):
    text = read(path)
    families = set(re.findall(r"^# TYPE (kvserve_[a-z0-9_]+) ", text, re.M))
    scraped = set(re.findall(r"^(kvserve_[a-z0-9_]+)[{ ]", text, re.M))
    unknown = sorted(scraped - series)
    r.check("live /metrics: every kvserve_* series is known to the source "
            "scan", families and not unknown, f"unknown {unknown}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--metrics-file", help="a live /metrics scrape")
    ap.add_argument("--write-prometheusrule", action="store_true",
                    help="regenerate deploy/k8s/prometheusrule.yaml and exit")
    a = ap.parse_args()
    src = a.source_dir
    if a.write_prometheusrule:
        with open(os.path.join(src, "deploy", "k8s", "prometheusrule.yaml"),
                  "w", encoding="utf-8") as f:
            f.write(prometheusrule_text(src))
        return 0
    r = Report()
    series = known_series(src)
    flags = serve_flags(src)
    r.check("source scan found metrics and flags",
            "kvserve_kv_blocks" in series and "drain-timeout" in flags,
            f"{len(series)} series, {len(flags)} flags")
    check_k8s(r, src, src, flags, series)
    check_systemd(r, src, src, flags)
    check_docker(r, src, flags)
    check_dashboard(r, src, series)
    check_alerts(r, src, series)
    check_prometheusrule(r, src)
    if a.metrics_file:
        check_scrape(r, a.metrics_file, series)
    print(f"deploy_checks: {r.passed} passed, {r.failed} failed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
