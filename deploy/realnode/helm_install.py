"""Installs (or upgrades) slinky-host with its Helm chart, as `helm upgrade --install --wait` does, by
Helm's own Go code (the helm-python-sdk wheel embeds Helm 4's SDK, so no helm binary is needed).

usage: helm_install.py CHART RELEASE NAMESPACE VALUES_JSON [TIMEOUT_SECONDS]

Prints the release's name, revision and status; exits non-zero, with Helm's error, when the install
or upgrade fails or its objects are not ready within the timeout.
"""
import json
import sys

import helm_python as helm

chart_dir, release, namespace, values = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
timeout = int(sys.argv[5]) if len(sys.argv) > 5 else 600

with helm.Config(namespace=namespace) as config:
    try:
        config.status(release)
        action = "upgraded"
    except helm.HelmNotFoundError:
        action = "installed"
    try:
        if action == "upgraded":
            result = config.upgrade(chart_dir, release, values, namespace=namespace,
                                    timeout=timeout, wait="watcher", reset_values=True)
        else:
            result = config.install(chart_dir, release, values, namespace=namespace,
                                    timeout=timeout, wait="watcher", create_namespace=True)
    except helm.HelmError as e:
        sys.exit(f"helm: {release} not {action} in {namespace}: {e}")
    print(f"helm: release {release} {action} in {namespace}: revision {result.get('revision')}, "
          f"{result.get('status')}, chart {result.get('chart_name')}-{result.get('chart_version')}")
