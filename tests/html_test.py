"""The HTML reports in a real browser: headless Chromium (Debian's `chromium`).

For estimate, plan, sweep and explain: write the page with --html, load it from
file:// in headless Chromium, and check that
  - it renders, and the rendered DOM shows the numbers that the same command's
    --json output gives, formatted as the page prints them (the unit that fits, 2 decimals);
  - its script ran to the end without an error (the report page sets
    data-vs-script="done" on <html> as its last statement; sweep and plan pages
    have no script at all, which is checked instead);
  - the browser logged no console message (a Content-Security-Policy
    violation, i.e. a blocked fetch, and an uncaught exception both log one);
  - the page requested nothing from the network: Chromium's NetLog
    (--log-net-log) records every URL request the browser makes; none may come
    from the page. (A fresh headless Chromium also makes requests of its own -
    component updater, account checks - which the NetLog marks as not coming
    from any origin; `MAP * ~NOTFOUND` keeps all of them off the network.)
A control page that does fetch, load an image and throw shows that each
detector fires, so the checks cannot pass vacuously.

Skipped only when no Chromium is installed (CI installs it: scripts/deps.sh).
Run by ctest (tests/CMakeLists.txt) with VRAMSCOPE_BIN set, or by hand:
    VRAMSCOPE_BIN=build/cli/vramscope python3 -m pytest -q tests/html_test.py
"""
import html
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
GiB = 1 << 30

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

# Flags for a short, quiet, isolated run. --virtual-time-budget lets the
# page's scripts and timers run before --dump-dom prints the DOM.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--disable-breakpad", "--no-pings",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection",
    "--disable-features=NetworkTimeServiceQuerying,Translate,OptimizationHints,MediaRouter",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=5000",
    "--enable-logging=stderr", "--v=0",
]


def gib(n):
    """FormatBytes (src/report): the unit that fits, two decimals."""
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f} KiB"
    return f"{n} B"


class Page:
    """What Chromium made of one HTML file."""

    def __init__(self, dom, console, page_requests, netlog_events):
        self.dom = dom                      # document.documentElement.outerHTML after scripts
        self.console = console              # console messages (CSP violations, exceptions, logs)
        self.page_requests = page_requests  # URLs the page requested over the network stack
        self.netlog_events = netlog_events  # how many NetLog events were recorded at all

    def text(self):
        """The DOM's text with tags dropped and entities decoded."""
        return html.unescape(re.sub(r"<[^>]*>", " ", self.dom))


def page_requests_from_netlog(path):
    """URLs of requests the page made: URL_REQUEST_START_JOB events whose
    initiator is an origin (the browser's own requests say 'not an origin')
    or whose network isolation key is the file:// page's."""
    log = json.loads(path.read_text())
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for event in log["events"]:
        if types.get(event["type"]) != "URL_REQUEST_START_JOB":
            continue
        p = event.get("params", {})
        from_page = p.get("initiator", "not an origin") != "not an origin" or \
            "file://" in p.get("network_isolation_key", "")
        if from_page:
            urls.append(p.get("url", "?"))
    return urls, len(log["events"])


def load(path, tmp_path):
    """Opens `path` (a local file) in headless Chromium."""
    profile = tmp_path / "chromium-profile"
    netlog = tmp_path / "netlog.json"
    p = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--log-net-log={netlog}",
         "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    requests, events = page_requests_from_netlog(netlog)
    return Page(p.stdout, console, requests, events)


def vramscope_json(*args):
    p = subprocess.run([BIN, *args, "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def assert_clean(page):
    assert "<body" in page.dom, "nothing rendered"
    assert page.netlog_events > 0, "the NetLog recorded nothing: network checking is not working"
    assert page.page_requests == [], f"the page made network requests: {page.page_requests}"
    assert page.console == [], "console messages:\n" + "\n".join(page.console)


def assert_has_no_script(html_file):
    source = html_file.read_text()
    assert "<script" not in source
    assert "default-src 'none'" in source


# --- the detectors themselves ------------------------------------------------

def test_detectors_see_requests_console_errors_and_the_marker(tmp_path):
    control = tmp_path / "control.html"
    control.write_text(
        "<!DOCTYPE html><html><body><img src=\"http://vramscope-test.invalid/i.png\">"
        "<script>fetch('https://vramscope-test.invalid/f').catch(function () {});"
        "document.documentElement.setAttribute('data-vs-script', 'done');"
        "null.x;</script></body></html>")
    page = load(control, tmp_path)
    assert "http://vramscope-test.invalid/i.png" in page.page_requests
    assert "https://vramscope-test.invalid/f" in page.page_requests
    assert any("Uncaught TypeError" in line for line in page.console)
    assert 'data-vs-script="done"' in page.dom

    blocked = tmp_path / "blocked.html"
    blocked.write_text(
        "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" "
        "content=\"default-src 'none'\"></head><body>"
        "<img src=\"http://vramscope-test.invalid/i.png\"></body></html>")
    page = load(blocked, tmp_path)
    assert page.page_requests == []  # CSP stops it before the network stack ...
    assert any("Content Security Policy" in line for line in page.console)  # ... and says so


# --- the four commands ---------------------------------------------------------

def test_estimate_html(tmp_path):
    out = tmp_path / "estimate.html"
    r = vramscope_json("estimate", "qwen2.5-0.5b", "--seq", "1024", "--batch", "2", "--html", str(out))
    page = load(out, tmp_path)
    assert_clean(page)
    assert re.search(r"<html[^>]*\bdata-vs-script=\"done\"", page.dom), "the page's script did not finish"
    values = re.findall(r'<div class="value">([^<]*)</div>', page.dom)
    assert values[:3] == [gib(r["peak_allocated_bytes"]), gib(r["peak_reserved_bytes"]),
                          gib(r["device_total_bytes"])]
    text = page.text()
    assert r["model"]["name"] in text
    for phase in r["phases"]:
        assert gib(phase["peak_allocated_bytes"]) in text
    assert 'class="vs-chart' in page.dom


def test_explain_html(tmp_path):
    out = tmp_path / "explain.html"
    snapshot = ROOT / "tests" / "data" / "snapshots" / "train_1step.json"
    r = vramscope_json("explain", str(snapshot), "--html", str(out))
    page = load(out, tmp_path)
    assert_clean(page)
    assert re.search(r"<html[^>]*\bdata-vs-script=\"done\"", page.dom), "the page's script did not finish"
    values = re.findall(r'<div class="value">([^<]*)</div>', page.dom)
    assert values[:3] == [gib(r["peak_allocated_bytes"]), gib(r["peak_reserved_bytes"]),
                          gib(r["device_total_bytes"])]
    assert r["peak_allocated_bytes"] > 0


def test_sweep_html(tmp_path):
    out = tmp_path / "sweep.html"
    r = vramscope_json("sweep", "qwen2.5-0.5b", "--seq", "256,1024,4096", "--html", str(out))
    assert_has_no_script(out)
    page = load(out, tmp_path)
    assert_clean(page)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page.dom, re.S)
    cells = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]
    for point in r["points"]:
        expected = [str(point["seq"]), gib(point["peak_allocated_bytes"]), gib(point["peak_reserved_bytes"]),
                    gib(point["device_total_bytes"])]
        assert any(c[:4] == expected for c in cells), (expected, cells)
    assert "<svg" in page.dom


def test_plan_html(tmp_path):
    out = tmp_path / "plan.html"
    r = vramscope_json("plan", "qwen2.5-0.5b", "--gpu", "rtx-4090", "--seq", "1024",
                       "--tokens-per-step", "8192", "--html", str(out))
    assert_has_no_script(out)
    page = load(out, tmp_path)
    assert_clean(page)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", page.dom, re.S)
    cells = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]
    strategies = r["strategies"]
    assert strategies and any(s["fits"] for s in strategies)
    for s in strategies:
        expected = [str(s["rank"]), f"{s['tokens_per_second']:.0f}", f"{s['step_seconds']:.2f}",
                    gib(s["device_total_bytes"]), gib(s["peak_allocated_bytes"])]
        assert any(c[:5] == expected and c[6] == s["label"] for c in cells), (expected, s["label"])
    text = page.text()
    for line in r["explanation"]:
        assert line in text
