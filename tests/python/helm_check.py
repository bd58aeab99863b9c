"""`helm lint` and `helm template` of a chart, with Helm's own Go code (the helm-python-sdk
wheel embeds it), for the chart tests.

usage: helm_check.py CHART RELEASE NAMESPACE [VALUES_JSON]

Prints {"lint": <lint report>, "manifests": {template path: rendered text}} as JSON; exits
non-zero when the chart does not load or a template fails to render.
"""
import json
import sys

from helm_python.chart import Chart, lint

chart_dir, release, namespace = sys.argv[1], sys.argv[2], sys.argv[3]
values = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
report = lint(chart_dir, values, strict=True, namespace=namespace)
chart = Chart.load(chart_dir)
chart.validate_schema(values)
manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
json.dump({"lint": report, "manifests": manifests}, sys.stdout, sort_keys=True)
