#!/usr/bin/env python3
"""Deployment files are valid and agree with the real server.

1. Live (needs the built kvserve and the default model): start kvserve
   with the Kubernetes Deployment's flags (they must parse), ask
   the gRPC health service for every service name the Kubernetes probes use
   (they must answer SERVING, else pods never become ready), run the
   container HEALTHCHECK command of Dockerfile.cpu against it, scrape
   /metrics after one completion, and stop it with SIGTERM: it must exit 0
   within the drain timeout plus the close grace that the Kubernetes and
   systemd grace periods are sized from.
   Also: every `kvserve plan` output quoted in docs/SCALING.md is current.
2. Static: tools/validate_deploy.sh (hadolint, systemd-analyze, promtool,
   kubernetes-validate, metric names against the source and the scrape).

Exit 77 (skipped) when a validator is missing and nothing failed.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import yaml  # PyYAML comes with kubernetes-validate (deploy/setup.sh)
except ImportError:
    print("SKIP: PyYAML missing (run deploy/setup.sh)")
    sys.exit(77)

LOCAL_FLAGS = ("--host", "--model", "--port", "--http-port",
               "--metrics-port")


def kvserve_container(source_dir):
    path = os.path.join(source_dir, "deploy", "k8s", "deployment.yaml")
    with open(path, encoding="utf-8") as f:
        deploy = yaml.safe_load(f)
    return deploy["spec"]["template"]["spec"]["containers"][0]


def probe_services(source_dir):
    c = kvserve_container(source_dir)
    return sorted({c[p]["grpc"].get("service", "") for p in
                   ("startupProbe", "readinessProbe", "livenessProbe")})


def deployment_args(source_dir):
    """The Kubernetes Deployment's kvserve flags (values included), less
    the ones the local test server sets itself (host, model, ports)."""
    args = kvserve_container(source_dir)["args"]
    return [a for a in args if a.split("=")[0] not in LOCAL_FLAGS]


def drain_seconds(args):
    for a in args:
        if a.startswith("--drain-timeout="):
            return float(a.split("=", 1)[1])
    return 30.0


def health_status(port, service):
    """grpc.health.v1.Health/Check with hand-encoded protobuf (field 1,
    string) so that no generated code is needed; 1 = SERVING."""
    import grpc
    name = service.encode()
    request = (b"\x0a" + bytes([len(name)]) + name) if name else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        try:
            reply = call(request, timeout=10)
        except grpc.RpcError as e:  # NOT_FOUND: no such service registered
            return str(e.code())
    return reply[1] if reply[:1] == b"\x08" else 0  # proto3 omits 0


def healthcheck_command(source_dir, http_port):
    path = os.path.join(source_dir, "deploy", "docker", "Dockerfile.cpu")
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    cmd = json.loads(re.search(r"HEALTHCHECK .*?CMD (\[.*\])", text).group(1))
    return [a.replace("/9090", f"/{http_port}") for a in cmd]


def scaling_doc_checks(binary, source_dir):
    """Every `$ kvserve plan ...` block quoted in docs/SCALING.md is what
    the binary prints now (lines elided with `...` aside)."""
    with open(os.path.join(source_dir, "docs", "SCALING.md"),
              encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"^\$ kvserve (plan [^\n]*)\n(.*?)(?=^\$ |^```)",
                        text, re.M | re.S)
    failures = []
    for cmd, quoted in blocks:
        out = subprocess.run([binary, *cmd.split()], capture_output=True,
                             text=True, timeout=60).stdout.splitlines()
        stale = [ln for ln in quoted.splitlines()
                 if ln.strip() and ln.strip() != "..." and ln not in out]
        ok = bool(out) and not stale
        print(("PASS " if ok else "FAIL ") + f"docs/SCALING.md quotes "
              f"`kvserve {cmd}`" + ("" if ok else f": stale {stale}"))
        if not ok:
            failures.append(cmd)
    if not blocks:
        print("FAIL docs/SCALING.md: no `$ kvserve plan` blocks found")
        failures.append("SCALING.md")
    return failures


def live_checks(binary, source_dir, scrape_path):
    sys.path.insert(0, os.path.join(source_dir, "tests", "server"))
    from kvserve_process import KvserveProcess
    failures = []

    def check(name, ok, detail=""):
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else
                                                     f": {detail}"))
        if not ok:
            failures.append(name)

    # Started with the Deployment's own flag values: they must parse.
    args = deployment_args(source_dir)
    try:
        server = KvserveProcess(binary, source_dir, *args, "--threads", "2",
                                timeout=180)
    except RuntimeError as e:
        check(f"kvserve starts with the Deployment's flags {args}", False,
              str(e))
        return failures
    check(f"kvserve starts with the Deployment's flags {args}", True)
    try:
        try:
            import grpc  # noqa: F401
            for service in probe_services(source_dir):
                status = health_status(server.grpc_port, service)
                check(f"gRPC health '{service}' (a k8s probe) is SERVING",
                      status == 1, f"status {status}")
        except ImportError:
            print("SKIP gRPC health checks (grpcio not installed)")
        cmd = healthcheck_command(source_dir, server.http_port)
        rc = subprocess.run(cmd, timeout=10).returncode
        check("Dockerfile HEALTHCHECK command passes on a ready server",
              rc == 0, f"exit {rc}")
        body = json.dumps({"prompt": "Hello", "max_tokens": 2,
                           "temperature": 0}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{server.http_port}/v1/completions", body,
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            check("one completion", resp.status == 200, str(resp.status))
        with urllib.request.urlopen(
                f"http://127.0.0.1:{server.http_port}/metrics",
                timeout=10) as resp:
            with open(scrape_path, "wb") as f:
                f.write(resp.read())
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            rc = server.proc.wait(timeout=drain_seconds(args) + 30)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        # Idle, so the drain ends at once; 5 s is kGrpcShutdownGrace, which
        # the grace periods add to the drain.
        check("SIGTERM: exits 0 within the drain timeout + 5 s",
              rc == 0 and took <= drain_seconds(args) + 5,
              f"exit {rc} after {took:.1f} s")
    finally:
        server.kill()
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        scrape = os.path.join(tmp, "metrics.txt")
        model = os.path.join(a.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        extra = []
        if a.binary and os.path.exists(a.binary):
            failures += scaling_doc_checks(a.binary, a.source_dir)
        if a.binary and os.path.exists(a.binary) and os.path.exists(model):
            failures += live_checks(a.binary, a.source_dir, scrape)
            if os.path.exists(scrape):
                extra = ["--metrics-file", scrape]
            extra += ["--binary", os.path.abspath(a.binary)]
        else:
            print("SKIP live checks (no kvserve binary or default model)")
        rc = subprocess.run(
            [os.path.join(a.source_dir, "tools", "validate_deploy.sh"),
             *extra], timeout=300).returncode
    if failures or rc not in (0, 77):
        print(f"deploy_validate_test: FAILED {failures} validate rc={rc}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
