"""The web page (web/, built by scripts/build_web.sh into build-web/web/) in
headless Chromium, driven over the DevTools protocol (--remote-debugging-pipe:
NUL-separated JSON on file descriptors 3 and 4, so the Python standard library
is enough; no Playwright, no websockets).

The page is loaded from file:// with the network disabled (the flags of
tests/html_test.py: every host name resolves to nothing). For each setup of
SETUPS the test sets the knobs through the DOM (values, then one `change`
event, as a user's last edit fires), reads the three numbers the page shows,
and checks them against `vramscope estimate --json` run with the same knobs
written as CLI flags here (not read back from the page). Then: the URL hash
the page wrote, opened in a fresh page, gives back the same knobs, the same
hash and the same numbers; the page's "copy as CLI command" text, run, gives
the same numbers; and no request left the machine (DevTools' Network events
and Chromium's NetLog, as html_test.py reads it).

Skipped when Chromium or the built page is missing, unless VRAMSCOPE_WEB=ON
(scripts/build.sh builds the page whenever emscripten is installed).
Timings for README.md: python3 tests/web_test.py --timing
"""
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from html_test import BIN, CHROMIUM, CHROMIUM_FLAGS, gib, page_requests_from_netlog  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = pathlib.Path(os.environ.get("VRAMSCOPE_WEB_PAGE", ROOT / "build-web" / "web" / "index.html"))
REQUIRED = os.environ.get("VRAMSCOPE_WEB") == "ON"

pytestmark = pytest.mark.skipif(
    not REQUIRED and (CHROMIUM is None or not PAGE.exists()),
    reason="no chromium or no build-web/web/index.html (scripts/build_web.sh needs emscripten)")

# knob id on the page (= the flag without "--") -> value; "model" is the
# catalog alias. Booleans are checkboxes.
SETUPS = [
    {"model": "llama-3-8b"},
    {"model": "llama-3-8b", "batch": "2", "seq": "4096", "grad-ckpt": "full", "gpu": "a100-80g"},
    {"model": "qwen2.5-0.5b", "precision": "bf16", "optimizer": "adamw-8bit", "attn": "flash"},
    {"model": "llama-3-8b", "finetune": "lora", "lora-rank": "64", "lora-targets": "all-linear"},
    {"model": "llama-3-8b", "finetune": "qlora", "gpu": "rtx-4090", "grad-ckpt": "full", "seq": "1024"},
    {"model": "llama-3-8b", "gpus": "8", "zero": "3", "grad-ckpt": "full"},
    {"model": "llama-3-8b", "gpus": "8", "zero": "2", "offload": "optimizer"},
    {"model": "llama-3-8b", "gpus": "8", "fsdp": "full", "batch": "4"},
    {"model": "llama-3-70b", "gpus": "16", "fsdp": "hybrid", "grad-ckpt": "full"},
    {"model": "llama-3-70b", "tp": "4", "pp": "2", "sp": True, "grad-accum": "4"},
    {"model": "llama-3-8b", "tp": "2", "pp": "2", "gpus": "8", "zero": "1", "grad-accum": "2"},
    {"model": "llama-3-8b", "alloc-conf": "expandable_segments:True", "loss": "chunked", "batch": "4"},
    {"model": "llama-3-8b", "gpus": "4", "ddp": True, "precision": "fp16-mixed", "optimizer": "sgd-momentum"},
    # "other flags": knobs without a field of their own.
    {"model": "flux.1-dev-transformer", "finetune": "lora", "lora-targets": "q,k,v,o",
     "precision": "bf16", "grad-ckpt": "full", "extra-flags": "--text-encoder sd-1.5-text-encoder "
     "--text-encoder t5-v1_1-xxl-encoder --image-size 512 --text-len 256"},
]

NUMBERS = {"peak-allocated": "peak_allocated_bytes", "peak-reserved": "peak_reserved_bytes",
           "device-total": "device_total_bytes"}


class Browser:
    """Headless Chromium with one page, over --remote-debugging-pipe."""

    def __init__(self, tmp_path):
        self.netlog = tmp_path / "netlog.json"
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def wire_fds():  # the child's fd 3 reads commands, fd 4 writes answers
            # Copies first: a pipe may already be fd 3 or 4, and dup2 onto
            # itself would keep close-on-exec.
            read_end, write_end = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")]
        self.proc = subprocess.Popen(
            [CHROMIUM, *flags, "--remote-debugging-pipe", f"--user-data-dir={tmp_path / 'profile'}",
             f"--log-net-log={self.netlog}", "about:blank"],
            close_fds=False, preexec_fn=wire_fds,  # close_fds would close 3 and 4 after wire_fds
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buffer, self.next_id, self.events = b"", 0, []
        self.session = None
        page = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):  # Log: CSP violations, failed loads
            self.send(f"{domain}.enable")

    def _read_message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe: " + self.proc.stderr.read().decode()[-2000:])
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def eval(self, expression):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url):
        """Navigates and waits until the page has shown its first result."""
        self.send("Page.navigate", url=url)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.eval("document.readyState === 'complete' && document.body.dataset.runs === '1'"):
                return
            time.sleep(0.05)
        raise RuntimeError("the page showed no result: " + str(self.eval("document.body.innerText"))[:2000])

    def close(self):
        try:
            self.send("Browser.close")
        except RuntimeError:
            pass
        self.proc.wait(timeout=30)
        os.close(self.to_chrome)
        os.close(self.from_chrome)

    def network_urls(self):
        """Every URL the page asked for, per DevTools."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def console_errors(self):
        """Uncaught exceptions, console.error calls and the browser's own
        error log entries (a Content-Security-Policy violation is one)."""
        return [e["params"] for e in self.events
                if e.get("method") == "Runtime.exceptionThrown"
                or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") == "error")
                or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]


# Sets the knobs of `setup` through the DOM (every other knob to its default),
# fires one change event, and returns what the page shows.
SET_KNOBS_JS = """
(setup) => {
  const all = Object.assign({}, DEFAULTS);
  for (const [k, v] of Object.entries(setup)) if (k !== 'model') all[k] = v;
  document.getElementById('source-catalog').checked = true;
  document.getElementById('model').value = setup.model;
  for (const [id, v] of Object.entries(all)) {
    const node = document.getElementById(id);
    if (node.type === 'checkbox') node.checked = v === true; else node.value = v;
  }
  const before = Number(document.body.dataset.runs);
  document.getElementById('seq').dispatchEvent(new Event('change'));
  if (Number(document.body.dataset.runs) !== before + 1) throw new Error('no estimate ran');
  return READ_PAGE();
}
"""

READ_PAGE_JS = """
() => {
  const out = {hash: location.hash, cli: document.getElementById('cli').textContent,
               error: document.getElementById('error').textContent, ok: document.body.dataset.ok,
               knobs: {model: document.getElementById('model').value}, numbers: {}};
  for (const id of KNOB_IDS) {
    const node = document.getElementById(id);
    out.knobs[id] = node.type === 'checkbox' ? node.checked : node.value;
  }
  for (const id of ['peak-allocated', 'peak-reserved', 'device-total']) {
    const node = document.getElementById(id);
    out.numbers[id] = {text: node.textContent, bytes: node.dataset.bytes};
  }
  return out;
}
"""


def set_knobs(browser, setup):
    return browser.eval(f"window.READ_PAGE = {READ_PAGE_JS}; ({SET_KNOBS_JS})({json.dumps(setup)})")


def read_page(browser):
    return browser.eval(f"({READ_PAGE_JS})()")


def cli_flags(setup):
    flags = [setup["model"]]
    for knob, value in setup.items():
        if knob == "model":
            continue
        if knob == "extra-flags":
            flags += value.split()
            continue
        flags += [f"--{knob}"] if value is True else [f"--{knob}", value]
    return flags


def vramscope_estimate(args):
    p = subprocess.run([BIN, "estimate", *args, "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def assert_numbers_equal(shown, expected, what):
    assert shown["ok"] == "true", f"{what}: the page says {shown['error']}"
    for element, key in NUMBERS.items():
        assert shown["numbers"][element]["bytes"] == str(expected[key]), (what, key)
        assert shown["numbers"][element]["text"] == f"{expected[key] / (1 << 30):.2f} GiB", (what, key)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium"))
    b.open(PAGE.resolve().as_uri())
    yield b
    b.close()


def test_page_numbers_equal_the_cli(browser):
    assert gib(1 << 30) == "1.00 GiB"
    for setup in SETUPS:
        shown = set_knobs(browser, setup)
        assert_numbers_equal(shown, vramscope_estimate(cli_flags(setup)), setup)


def test_copy_as_cli_command_is_the_same_estimate(browser):
    setup = SETUPS[9]
    shown = set_knobs(browser, setup)
    argv = shlex.split(shown["cli"])
    assert argv[0] == "vramscope" and argv[1] == "estimate" and argv[-1] == "--json"
    assert_numbers_equal(shown, vramscope_estimate(argv[2:-1]), shown["cli"])


def test_url_hash_round_trips(browser):
    for setup in (SETUPS[3], SETUPS[9], SETUPS[11]):
        shown = set_knobs(browser, setup)
        for knob, value in setup.items():
            assert shown["knobs"][knob] == value, (knob, shown["knobs"][knob])
        browser.send("Page.navigate", url="about:blank")
        browser.open(PAGE.resolve().as_uri() + shown["hash"])
        again = read_page(browser)
        assert again["hash"] == shown["hash"]
        assert again["knobs"] == shown["knobs"]
        assert again["numbers"] == shown["numbers"]


def test_pasted_config_json_equals_the_cli(browser, tmp_path):
    path = ROOT / "data" / "models" / "qwen2.5-0.5b.json"  # a Hugging Face config.json
    text = path.read_text()
    (tmp_path / "config.json").write_text(text)
    shown = browser.eval(f"""(() => {{
      for (const [id, v] of Object.entries(DEFAULTS)) {{
        const node = document.getElementById(id);
        if (node.type === 'checkbox') node.checked = v; else node.value = v;
      }}
      document.getElementById('source-config').checked = true;
      document.getElementById('config').value = {json.dumps(text)};
      document.getElementById('batch').value = '2';
      document.getElementById('config').dispatchEvent(new Event('change'));
      return ({READ_PAGE_JS})();
    }})()""")
    assert_numbers_equal(shown, vramscope_estimate([str(tmp_path / "config.json"), "--batch", "2"]), path)
    # The hash holds the pasted config too: a shared link computes the same.
    browser.send("Page.navigate", url="about:blank")
    browser.open(PAGE.resolve().as_uri() + shown["hash"])
    again = read_page(browser)
    assert (again["hash"], again["numbers"]) == (shown["hash"], shown["numbers"])
    assert browser.eval("document.getElementById('config').value") == text


def test_sweep_chart_points_equal_the_cli(browser):
    """The sweep chart's points are `vramscope sweep --json`'s, knobs and grid alike."""
    set_knobs(browser, {"model": "llama-3-8b", "finetune": "lora", "grad-ckpt": "full"})
    deadline = time.time() + 60
    note = "document.getElementById('sweep-note').textContent"
    while time.time() < deadline and "estimates" not in browser.eval(note):
        time.sleep(0.1)
    points = browser.eval("window.vramscope.sweepPoints")
    grid = ",".join(str(p["seq"]) for p in points)
    p = subprocess.run([BIN, "sweep", "llama-3-8b", "--finetune", "lora", "--grad-ckpt", "full", "--seq", grid,
                        "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert points == json.loads(p.stdout)["points"]
    assert browser.eval("document.querySelectorAll('#sweep circle').length") == len(points)


def test_explain_shows_the_explanation(browser):
    shown = set_knobs(browser, {"model": "llama-3-8b", "explain": True})
    assert shown["ok"] == "true" and "--explain" in shown["cli"]
    expected = vramscope_estimate(["llama-3-8b", "--explain"])["explanation"]
    assert browser.eval("document.querySelectorAll('#explanation li').length") == len(expected) > 0
    assert browser.eval("document.getElementById('explain-box').hidden") is False


def test_timeline_zooms_and_resets(browser):
    """Dragging across the timeline redraws it over fewer events; a double
    click draws all of them again."""
    set_knobs(browser, {"model": "llama-3-8b"})
    counts = browser.eval("""(() => {
      const points = () => document.querySelector('#timeline polyline.allocated').getAttribute('points')
        .split(' ').length;
      const all = points();
      const svg = document.querySelector('#timeline svg'), box = svg.getBoundingClientRect();
      const at = (type, f) => svg.dispatchEvent(new MouseEvent(type, {bubbles: true,
        clientX: box.left + f * box.width, clientY: box.top + box.height / 2}));
      at('mousedown', 0.3); at('mousemove', 0.5); at('mouseup', 0.5);
      const zoomed = points();
      document.querySelector('#timeline svg').dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
      return [all, zoomed, points()];
    })()""")
    assert counts[0] > 100 and 2 < counts[1] < counts[0] / 2 and counts[2] == counts[0], counts


BAD_INPUTS = [["llama-3-8b", "--batch", "0"], ["llama-3-8b", "--precision", "fp8"], ["no-such-model"],
              ["llama-3-8b", "--tp", "3"], ["llama-3-8b", "--gpus", "3", "--tp", "2"]]


def test_bad_input_gets_the_cli_message(browser, tmp_path):
    """The page shows the CLI's error message: flag parsing (CLI11's
    exceptions), model resolution, layout checks and a broken config.json
    (nlohmann_json's exceptions) fail in the engine as on the command line."""
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    for args in [*BAD_INPUTS, [str(bad)]]:
        p = subprocess.run([BIN, "estimate", *args, "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2, p.stderr
        expected = p.stderr.strip().splitlines()[0].removeprefix("vramscope: error: ").removesuffix(" (see --help)")
        argv = ["estimate", *args]
        files = {}
        if args == [str(bad)]:
            argv, files = ["estimate", "/page/config.json"], {"/page/config.json": bad.read_text()}
            expected = expected.replace(str(bad), "/page/config.json")
        answer = browser.eval(f"callEngine({json.dumps(argv)}, {json.dumps(files)})")
        assert answer == {"ok": False, "error": expected}


def test_no_request_left_the_machine(browser):
    assert any(u.startswith("file://") for u in browser.network_urls()), "DevTools saw no request at all"
    urls = [u for u in browser.network_urls() if not u.startswith(("file://", "data:", "about:"))]
    assert urls == [], urls
    assert browser.console_errors() == []
    requests, events = page_requests_from_netlog_when_flushed(browser)
    assert events > 0
    assert [u for u in requests if not u.startswith("file://")] == []


def test_hub_fetch_offline_says_so_and_is_seen(browser):
    """The one request the page can make, on the user's click: offline it
    says so, and the detector above sees the attempt (it is not blind)."""
    browser.eval("""(() => {
      document.getElementById('source-config').checked = true;
      document.getElementById('source-config').dispatchEvent(new Event('change'));
      document.getElementById('hub-id').value = 'Qwen/Qwen2.5-7B';
      document.getElementById('hub-fetch').click();
    })()""")
    deadline = time.time() + 30
    message = ""
    while time.time() < deadline and "Could not fetch" not in message:
        time.sleep(0.1)
        message = browser.eval("document.getElementById('hub-status').textContent")
    assert "Could not fetch from the Hub" in message and "paste" in message, message
    assert any("huggingface.co" in u for u in browser.network_urls())


def page_requests_from_netlog_when_flushed(browser):
    # Chromium writes the NetLog's closing bracket when it exits; until then
    # the file is read as far as it goes.
    text = browser.netlog.read_text() if browser.netlog.exists() else ""
    if not text.rstrip().endswith("}"):
        text = text.rstrip().rstrip(",") + "]}"
    tmp = browser.netlog.with_suffix(".closed.json")
    tmp.write_text(text)
    return page_requests_from_netlog(tmp)


# The setups README.md's timings are for: the URL hash of each.
TIMED = ["model=llama-3-8b", "model=llama-3-8b&finetune=lora&grad-ckpt=full",
         "model=llama-3-70b", "model=llama-3-70b&gpus=8&fsdp=full&grad-ckpt=full"]


def measure(tmp_path, hash_knobs, repeats=30):
    """Time to first result (navigation start to the first estimate shown,
    engine download and compile included) and per re-estimate (batch changed
    through the DOM, to the views redrawn; the sweep chart off)."""
    b = Browser(tmp_path)
    try:
        b.open(PAGE.resolve().as_uri() + f"#{hash_knobs}&sweep=")
        first = b.eval("window.vramscope.timing.first_result_ms")
        ms = b.eval(f"""(() => {{
          const out = [];
          for (let i = 0; i < {repeats}; i++) {{
            const node = document.getElementById('batch');
            node.value = String(1 + (i % 2));
            const t0 = performance.now();
            node.dispatchEvent(new Event('change'));
            out.push([performance.now() - t0, window.vramscope.timing.last_estimate_ms]);
          }}
          return out;
        }})()""")
        page = sorted(m[0] for m in ms)
        engine = sorted(m[1] for m in ms)
        return {"setup": hash_knobs, "first_result_ms": round(first),
                "re_estimate_ms": {"median": round(page[len(page) // 2], 1), "min": round(page[0], 1)},
                "engine_call_ms": {"median": round(engine[len(engine) // 2], 1), "min": round(engine[0], 1)}}
    finally:
        b.close()


if __name__ == "__main__" and "--timing" in sys.argv:
    import tempfile
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for setup in TIMED:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(measure(pathlib.Path(d), setup)))
