"""The frozen VAE's reference side (vsref/vae.py, `estimate --vae`): the catalog's published
AutoencoderKL configs and the grid's reduced ones have the parameters diffusers 0.42.1
makes, module by module and in named_parameters() order as the lowering places them; the
reduced VAE encodes the points' images; what is not modelled is refused by name. The
fidelity grid's VAE points (vsref/grid.py vae_points) compare whole steps.

Runs under .venv/tf5 (diffusers 0.42.1); skipped where diffusers is not installed.
"""

import json
import os
import subprocess
import sys

import pytest

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vsref import events, fidelity  # noqa: E402
from vsref.models import VAE_FAMILIES, VAE_SCALE, reference_config  # noqa: E402

CATALOG = os.path.normpath(os.path.join(HERE, "..", "..", "..", "data", "models"))


def _require_binary():
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")


def _meta_vae(config):
    with torch.device("meta"):
        return diffusers.AutoencoderKL.from_config(config)


def _estimate(*args):
    return subprocess.run([fidelity.VRAMSCOPE, "estimate", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("alias, parameters", [("sd-1.5-vae", 83_653_863),
                                               ("sdxl-vae", 83_653_863),
                                               ("flux.1-dev-vae", 83_819_683)])
def test_catalog_vaes_have_the_parameters_diffusers_makes(alias, parameters):
    _require_binary()
    with open(os.path.join(CATALOG, alias + ".json"), encoding="utf-8") as f:
        config = json.load(f)
    meta = config.pop("_vramscope")
    assert sum(p.numel() for p in _meta_vae(config).parameters()) == parameters
    assert meta["reference_parameters"] == parameters
    proc = subprocess.run([fidelity.VRAMSCOPE, "models", "--json"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {row["alias"]: row for row in json.loads(proc.stdout)}
    assert rows[alias]["parameters"] == parameters
    assert rows[alias]["model_type"] == "autoencoder_kl"


@pytest.mark.parametrize("vae", sorted(VAE_FAMILIES))
def test_vae_weights_are_diffusers_parameters_module_by_module(vae, tmp_path):
    """The setup allocations `estimate --vae` makes for the VAE (op vae.to, fp32 weights)
    are diffusers' named_parameters(): same modules, same sizes, same order."""
    _require_binary()
    config = VAE_FAMILIES[vae]
    want = [("vae." + name.rsplit(".", 1)[0], p.numel() * 4)
            for name, p in _meta_vae(config).named_parameters()]
    family = "flux_dev" if vae == "vae_flux" else "unet_sd15"
    denoiser, vae_path = tmp_path / "denoiser.json", tmp_path / "vae.json"
    denoiser.write_text(json.dumps(reference_config(family)), encoding="utf-8")
    vae_path.write_text(json.dumps(config), encoding="utf-8")
    out = tmp_path / "pred.events"
    proc = _estimate(str(denoiser), "--vae", str(vae_path), "--image-size", "64", "--text-len",
                     "8", "--precision", "fp32", "--steps", "1", "--events", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    got = [(a.module, a.bytes) for kind, a in events.read_stream(str(out)).events
           if kind == "a" and a.op == "vae.to"]
    assert got == want


def test_reduced_vae_encodes_the_points_images():
    from vsref import vae as vsvae

    model = vsvae.build_vae(VAE_FAMILIES["vae_sd"], torch.float32)
    image = reference_config("unet_sd15")["sample_size"] * VAE_SCALE
    latents = model.encode(torch.randn(2, 3, image, image)).latent_dist.sample()
    assert latents.shape == (2, 4, image // VAE_SCALE, image // VAE_SCALE)


@pytest.mark.parametrize("args, message", [
    (["sd-1.5-vae"], "--vae sd-1.5-vae"),
    (["sd-1.5-unet", "--vae", "sd-1.5-vae", "--vae-scale", "4"], "--vae-scale: 4 disagrees"),
    (["flux.1-dev-transformer", "--vae", "sd-1.5-vae"], "in_channels 64"),
    (["sd-1.5-unet", "--vae", "sd-1.5-unet"], "--vae: sd-1.5-unet is not a diffusers "
                                              "AutoencoderKL"),
    (["llama-3.2-1b", "--vae", "sd-1.5-vae"], "only the diffusion UNet and FLUX steps"),
], ids=["vae-alone", "scale-mismatch", "latent-channels", "not-a-vae", "not-diffusion"])
def test_refusals_name_the_flag(args, message):
    _require_binary()
    proc = _estimate(*args)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_without_vae_nothing_changes_and_with_it_the_weights_are_counted():
    """--vae adds the VAE's weights (bf16 under bf16-mixed) to every phase; the flag's
    absence is the step as before."""
    _require_binary()
    base = json.loads(_estimate("sd-1.5-unet", "--json").stdout)
    with_vae = json.loads(_estimate("sd-1.5-unet", "--vae", "sd-1.5-vae", "--json").stdout)
    setup = [p for p in base["phases"] if p["phase"] == "setup"][0]
    setup_vae = [p for p in with_vae["phases"] if p["phase"] == "setup"][0]
    assert setup_vae["peak_allocated_bytes"] - setup["peak_allocated_bytes"] >= 83_653_863 * 2
    assert with_vae["peak_allocated_bytes"] > base["peak_allocated_bytes"]
