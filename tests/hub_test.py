"""End-to-end tests of Hub ids and `vramscope models`.

A local HTTP server (http.server in a thread, 127.0.0.1, a free port) stands in
for the Hugging Face Hub: HF_ENDPOINT points at it and VRAMSCOPE_CACHE at a
temporary directory, so nothing here touches the network or the user's cache.
Run by ctest with VRAMSCOPE_BIN set to the built binary.
"""
import http.server
import json
import os
import pathlib
import socket
import subprocess
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))

TINY_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False,
}
CONFIG = "resolve/main/config.json"

# path -> (status, headers, body); paths are as sent (the revision stays quoted).
ROUTES = {
    f"/tiny/llama/{CONFIG}": (200, {}, json.dumps(TINY_LLAMA).encode()),
    "/tiny/llama/resolve/refs%2Fpr%2F1/config.json": (200, {}, json.dumps(TINY_LLAMA).encode()),
    f"/moved/llama/{CONFIG}": (307, {"Location": f"/tiny/llama/{CONFIG}"}, b""),
    f"/gated/model/{CONFIG}": (401, {}, b"Access restricted"),
    f"/gated-hub/model/{CONFIG}": (401, {"X-Error-Code": "GatedRepo"}, b"Access restricted"),
    f"/forbidden/model/{CONFIG}": (403, {}, b"Forbidden"),
    f"/broken/model/{CONFIG}": (200, {}, b'{"model_type": "llama", '),
    f"/mamba/model/{CONFIG}": (200, {}, json.dumps({"model_type": "mamba"}).encode()),
    f"/huge/model/{CONFIG}": (200, {}, b" " * (5 << 20) + b"{}"),
}


class FakeHub:
    """The stand-in Hub: serves ROUTES (anything else is 404) and records requests."""

    def __init__(self):
        self.requests = []  # (path, Authorization header or None)
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub.requests.append((self.path, self.headers.get("Authorization")))
                status, headers, body = ROUTES.get(
                    self.path, (404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found"))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (the size limit)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()
            self.thread = None

    def paths(self):
        return [path for path, _ in self.requests]


@pytest.fixture
def hub():
    h = FakeHub()
    yield h
    h.stop()


def clean_env(tmp_path, endpoint, **extra):
    """The environment of one run: no Hub or proxy settings from outside."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_", "VRAMSCOPE_CACHE",
                                "XDG_CACHE"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["HOME"] = str(tmp_path / "home")
    env["VRAMSCOPE_CACHE"] = str(tmp_path / "cache")
    env["HF_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def run(env, *args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)


def estimate(env, model):
    return run(env, "estimate", model, "--json", "--seq", "128")


def assert_one_line_error(p, *parts):
    assert p.returncode == 2, (p.returncode, p.stdout[-300:], p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), p.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def cached_files(tmp_path):
    return sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_hub_id_estimates_like_the_same_config_json_and_sends_the_token(hub, tmp_path):
    local = tmp_path / "config.json"
    local.write_text(json.dumps(TINY_LLAMA))
    env = clean_env(tmp_path, hub.endpoint, HF_TOKEN="hf_test_token")
    expected = estimate(env, str(local))
    assert expected.returncode == 0, expected.stderr
    p = estimate(env, "tiny/llama")
    assert p.returncode == 0, p.stderr
    r, e = json.loads(p.stdout), json.loads(expected.stdout)
    assert r["model"]["parameters"] == e["model"]["parameters"] == 90432
    assert r["peak_allocated_bytes"] == e["peak_allocated_bytes"]
    assert hub.requests == [(f"/tiny/llama/{CONFIG}", "Bearer hf_test_token")]
    files = cached_files(tmp_path)
    assert len(files) == 1 and files[0].name == "main.json", files
    assert json.loads(files[0].read_text()) == TINY_LLAMA


def test_token_file_is_read_and_no_token_sends_no_header(hub, tmp_path):
    env = clean_env(tmp_path, hub.endpoint)
    assert estimate(env, "tiny/llama").returncode == 0
    assert hub.requests[-1][1] is None
    token = tmp_path / "home" / ".cache" / "huggingface" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_from_file\n")
    assert estimate(env, "tiny/llama@refs/pr/1").returncode == 0
    assert hub.requests[-1] == ("/tiny/llama/resolve/refs%2Fpr%2F1/config.json",
                                "Bearer hf_from_file")


def test_second_run_uses_the_cache_with_the_server_stopped(hub, tmp_path):
    env = clean_env(tmp_path, hub.endpoint)
    first = estimate(env, "tiny/llama")
    assert first.returncode == 0, first.stderr
    hub.stop()
    second = estimate(env, "tiny/llama")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["model"] == json.loads(first.stdout)["model"]
    assert len(hub.requests) == 1
    # The cache is keyed by endpoint: another HF_ENDPOINT does not see it.
    other = estimate(clean_env(tmp_path, f"http://127.0.0.1:{closed_port()}"), "tiny/llama")
    assert_one_line_error(other, "could not reach HF_ENDPOINT")


def test_offline_uses_only_the_cache(hub, tmp_path):
    env = clean_env(tmp_path, hub.endpoint, HF_HUB_OFFLINE="1")
    p = estimate(env, "tiny/llama")
    assert_one_line_error(p, "tiny/llama", "HF_HUB_OFFLINE is set", "no config.json is cached")
    assert hub.requests == []
    assert estimate(clean_env(tmp_path, hub.endpoint), "tiny/llama").returncode == 0
    p = estimate(env, "tiny/llama")
    assert p.returncode == 0, p.stderr
    assert len(hub.requests) == 1


def test_redirect_is_followed(hub, tmp_path):
    p = estimate(clean_env(tmp_path, hub.endpoint, HF_TOKEN="hf_x"), "moved/llama")
    assert p.returncode == 0, p.stderr
    assert hub.requests == [(f"/moved/llama/{CONFIG}", "Bearer hf_x"),
                            (f"/tiny/llama/{CONFIG}", "Bearer hf_x")]


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HUB_ERRORS = [
    ("gated/model", ["gated/model: is gated or private", "HTTP 401",
                     "accept its license on the Hub and set HF_TOKEN"]),
    ("gated-hub/model", ["is gated or private", "set HF_TOKEN"]),
    ("forbidden/model", ["is gated or private", "HTTP 403"]),
    ("missing/model", ["missing/model: no such model on the Hub"]),
    ("broken/model", ["broken/model: config.json from", "is not valid JSON"]),
    ("mamba/model", ["\"mamba\" is not supported", "llama", "qwen2_moe", "gpt2"]),
    ("huge/model", ["larger than the size limit"]),
    ("bad owner/model", ["not a valid Hugging Face id"]),
    ("owner/model@../x", ["not a valid Hugging Face id", "revision"]),
]


@pytest.mark.parametrize("model,parts", HUB_ERRORS, ids=[m for m, _ in HUB_ERRORS])
def test_hub_errors_are_one_line_with_exit_2_and_are_not_cached(hub, tmp_path, model, parts):
    p = estimate(clean_env(tmp_path, hub.endpoint), model)
    assert_one_line_error(p, *parts)
    # The mamba config is what the Hub holds (valid JSON), so it is cached;
    # failed or malformed answers never are.
    assert len(cached_files(tmp_path)) == (1 if model == "mamba/model" else 0)


def test_unreachable_endpoint_says_what_to_do(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    p = estimate(clean_env(tmp_path, endpoint), "tiny/llama")
    assert_one_line_error(p, f"could not reach HF_ENDPOINT {endpoint}",
                          "pass a config.json path or set HF_ENDPOINT")


@pytest.mark.parametrize("model,alias", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("google/gemma-2-9b-it", "gemma-2-9b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
])
def test_offline_tuned_variant_points_at_its_base_model_in_the_catalog(tmp_path, model, alias):
    """Issue 40: an instruction-tuned id has its base model's architecture; offline, the
    catalog's base model is the answer."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    p = estimate(clean_env(tmp_path, endpoint), model)
    assert_one_line_error(p, "could not reach HF_ENDPOINT", "same architecture", f"pass {alias}")
    p = estimate(clean_env(tmp_path, endpoint, HF_HUB_OFFLINE="1"), model)
    assert_one_line_error(p, "HF_HUB_OFFLINE is set", f"pass {alias}")


def test_catalog_ids_never_reach_the_hub(hub, tmp_path):
    p = run(clean_env(tmp_path, hub.endpoint), "estimate", "meta-llama/Meta-Llama-3-8B", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["model"]["name"] == "llama-3-8b"
    assert hub.requests == []


def test_models_lists_the_catalog_as_json_and_text():
    p = subprocess.run([BIN, "models", "--json"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    models = json.loads(p.stdout)
    assert len(models) >= 40
    by_alias = {m["alias"]: m for m in models}
    llama = by_alias["llama-3-8b"]
    assert llama["hub_id"] == "meta-llama/Meta-Llama-3-8B"
    assert llama["model_type"] == "llama" and llama["architecture"] == "LlamaForCausalLM"
    assert llama["parameters"] == 8030261248 and isinstance(llama["parameters"], int)
    assert "MoE" in by_alias["mixtral-8x7b"]["note"]
    assert "vision" in by_alias["gemma-3-4b"]["note"]
    assert by_alias["llama-3-8b"]["note"] == ""

    text = subprocess.run([BIN, "models"], capture_output=True, text=True, timeout=30)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.strip().splitlines()
    assert len(lines) == len(models) + 1  # header
    assert any(line.startswith("llama-3-8b ") and "8.03B" in line for line in lines)


def test_models_filters_by_text_and_architecture():
    p = subprocess.run([BIN, "models", "--arch", "qwen2_moe", "--json"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert [m["alias"] for m in json.loads(p.stdout)] == ["qwen1.5-moe-a2.7b"]
    p = subprocess.run([BIN, "models", "QWEN2.5", "--json"], capture_output=True, text=True,
                       timeout=30)
    aliases = {m["alias"] for m in json.loads(p.stdout)}
    assert "qwen2.5-7b" in aliases and all("qwen2.5" in a for a in aliases)
    p = subprocess.run([BIN, "models", "--arch", "mamba"], capture_output=True, text=True,
                       timeout=30)
    assert_one_line_error(p, "--arch", "\"mamba\"", "llama")
