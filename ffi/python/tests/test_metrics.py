"""Metrics in the OpenMetrics text format, read by the Prometheus client's own
parser: from ``Table.metrics_text()``, and over HTTP from ``livereg reap
--metrics-addr``; counters and histograms move when a worker is killed."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, Iterator, Tuple

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import livereg

MakeTable = Callable[..., livereg.Table]
Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of the text, keyed by name and sorted labels; the parser
    refuses anything that is not valid OpenMetrics (and a missing ``# EOF``)."""
    found: Samples = {}
    # (The parser has no annotations.)
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, table: str, **labels: str) -> float:
    return found[(name, tuple(sorted({"table": table, **labels}.items())))]


def livereg_bin() -> str:
    path = os.environ.get("LIVEREG_BIN", "")
    assert os.access(path, os.X_OK), f"LIVEREG_BIN={path!r} is not the livereg binary (ffi/python/test builds it)"
    return path


def test_metrics_text_parses_and_moves_when_a_worker_is_killed(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=2.0, registration_grace=4.0)
    name = table.status().table
    drops: "queue.Queue[livereg.DropEvent]" = queue.Queue()
    before = samples(table.metrics_text())
    assert value(before, "livereg_registrations", name) == 0
    assert value(before, "livereg_capacity", name) == 8
    assert value(before, "livereg_reaper_up", name) == 0
    assert value(before, "livereg_registrations_ended_total", name, reason="process_exited") == 0
    with table.start_reaper(on_drop=drops.put):
        worker = subprocess.Popen([livereg_bin(), "worker", name, "--instance", "7"], stdout=subprocess.PIPE)
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().startswith(b"registered")
            running = samples(table.metrics_text())
            assert value(running, "livereg_registrations", name) == 1
            assert value(running, "livereg_reaper_up", name) == 1
            worker.send_signal(signal.SIGKILL)
            assert drops.get(timeout=5).reason == livereg.Reason.PROCESS_EXITED
        finally:
            worker.kill()
            worker.wait()
        deadline = time.monotonic() + 5
        while True:
            after = samples(table.metrics_text())
            if value(after, "livereg_registrations_ended_total", name, reason="process_exited") == 1:
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.01)
    assert value(after, "livereg_registrations", name) == 0
    assert value(after, "livereg_eviction_silence_seconds_count", name) == 1
    assert value(after, "livereg_eviction_silence_seconds_bucket", name, le="+Inf") == 1
    assert value(after, "livereg_scans_total", name) >= 1
    assert value(after, "livereg_scan_duration_seconds_count", name) >= 1


@pytest.fixture
def daemon(make_table: MakeTable) -> Iterator[Tuple[str, str]]:
    """``livereg reap --metrics-addr 127.0.0.1:0`` on a new table: its name
    and the URL it says it serves."""
    table = make_table(reap_timeout=2.0, registration_grace=4.0)
    name = table.status().table
    reaper = subprocess.Popen(
        [livereg_bin(), "reap", name, "--metrics-addr", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reaper.stderr is not None
        line = reaper.stderr.readline()
        found = re.search(r"serving metrics on (http://\S+/metrics)", line)
        assert found, line
        yield name, found.group(1)
    finally:
        reaper.send_signal(signal.SIGTERM)
        reaper.wait(timeout=10)


def scrape(url: str) -> Tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.headers["Content-Type"], response.read().decode()


def test_the_daemon_serves_metrics_over_http_and_they_move_after_a_kill(daemon: Tuple[str, str]) -> None:
    name, url = daemon
    content_type, text = scrape(url)
    assert content_type.startswith("application/openmetrics-text")
    assert value(samples(text), "livereg_registrations_ended_total", name, reason="process_exited") == 0
    worker = subprocess.Popen([livereg_bin(), "worker", name, "--instance", "3"], stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith(b"registered")
        deadline = time.monotonic() + 5
        while value(samples(scrape(url)[1]), "livereg_reaper_up", name) != 1:
            assert time.monotonic() < deadline, "the reaper never came up"
            time.sleep(0.02)
        assert value(samples(scrape(url)[1]), "livereg_registrations", name) == 1
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 5
    while value(samples(scrape(url)[1]), "livereg_registrations_ended_total", name, reason="process_exited") != 1:
        assert time.monotonic() < deadline, "the kill never showed in the metrics"
        time.sleep(0.02)
    with pytest.raises(urllib.error.HTTPError) as missing:
        scrape(url.replace("/metrics", "/other"))
    assert missing.value.code == 404


def test_status_format_openmetrics_parses(make_table: MakeTable) -> None:
    table = make_table(reap_timeout=2.0, registration_grace=4.0)
    name = table.status().table
    worker = table.register(5, "gpu5")
    text = subprocess.run(
        [livereg_bin(), "status", name, "--format", "openmetrics"], capture_output=True, text=True, check=True
    ).stdout
    found = samples(text)
    assert value(found, "livereg_registrations", name) == 1
    assert value(found, "livereg_registrations_ended_total", name, reason="deregistered") == 0
    worker.deregister()
