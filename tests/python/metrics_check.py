"""Parse a /metrics body with the official Prometheus Python client's parsers.

usage: metrics_check.py FORMAT FILE   (FORMAT: text | openmetrics)

Prints {"family": "type", ...} as JSON; exits non-zero (with the parser's error) when the
body is not valid in that format.
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as text

fmt, path = sys.argv[1], sys.argv[2]
body = open(path, encoding="utf-8").read()
parse = openmetrics if fmt == "openmetrics" else text
families = {f.name: f.type for f in parse(body)}
json.dump(families, sys.stdout, sort_keys=True)
