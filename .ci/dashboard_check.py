#!/usr/bin/env python3
"""Runs every query of a Grafana dashboard against a Prometheus HTTP API.

Usage: dashboard_check.py DASHBOARD.json http://HOST:PORT

Grafana's variables are given the values the dashboard's "All" would
($table: every table; $__rate_interval: one minute, the whole scripted
load). A query fails if Prometheus answers an error, no series, or a
series whose latest value is not a number (a histogram quantile with no
observations is NaN): a panel that would show "No data" or "NaN".
Also checks what an import needs: a datasource variable every panel and
query uses, unique panel ids, and the table variable's own query.
"""

import json
import math
import sys
import time
import urllib.parse
import urllib.request

VARIABLES = {"$__rate_interval": "1m", "${table}": ".*", "$table": ".*"}


def query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:
        answer = json.load(error)
    if answer.get("status") != "success":
        return None, f"error: {answer.get('errorType')}: {answer.get('error')}"
    return answer["data"]["result"], None


def numbers(result):
    return [float(sample["value"][1]) for sample in result]


def main():
    dashboard_path, base = sys.argv[1], sys.argv[2].rstrip("/")
    dashboard = json.load(open(dashboard_path))
    failures = []
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    if variables.get("datasource", {}).get("type") != "datasource":
        failures.append("no datasource variable: the dashboard cannot be imported anywhere")
    ids = [panel["id"] for panel in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        failures.append(f"panel ids repeat: {ids}")
    checked = 0
    for panel in dashboard["panels"]:
        title = panel["title"]
        sources = [panel.get("datasource")] + [t.get("datasource") for t in panel["targets"]]
        if any(source != {"type": "prometheus", "uid": "${datasource}"} for source in sources):
            failures.append(f"{title}: a datasource other than ${{datasource}}: {sources}")
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            result, error = query(base, expr)
            checked += 1
            if error:
                failures.append(f"{title}: {expr}: {error}")
            elif not result:
                failures.append(f"{title}: {expr}: no series")
            elif not all(math.isfinite(n) for n in numbers(result)):
                failures.append(f"{title}: {expr}: not a number: {numbers(result)}")
            else:
                print(f"ok  {title}: {expr} -> {numbers(result)}")
    # The table variable lists the tables: label_values(livereg_capacity, table).
    tables, error = query(base, "count by (table) (livereg_capacity)")
    if error or not tables:
        failures.append(f"the table variable would list no table: {error or 'no series'}")
    if failures:
        print(f"\n{len(failures)} of the dashboard's {checked} queries or checks failed:", file=sys.stderr)
        for failure in failures:
            print("  " + failure, file=sys.stderr)
        sys.exit(1)
    print(f"every one of the dashboard's {checked} queries returned data")


if __name__ == "__main__":
    main()
