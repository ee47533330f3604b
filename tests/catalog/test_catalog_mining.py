"""The catalog is mined, broad, and free of stochastic operators."""

import json
import subprocess
import sys

import pytest

from opsynth.catalog import CATEGORIES, load_catalog


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_at_least_100_torch_ops_in_10_categories(catalog):
    torch_ops = catalog.names(source="torch")
    assert len(torch_ops) >= 100
    cats = {catalog[n].category for n in torch_ops}
    assert len(cats) >= 10, cats
    assert cats <= set(CATEGORIES)


def test_core_operators_present_with_ranks(catalog):
    for name, rank in [("nn.Conv2d", 4), ("nn.Linear", 2), ("torch.relu", 4), ("nn.BatchNorm2d", 4),
                       ("nn.MaxPool2d", 4), ("torch.softmax", 2), ("nn.ConvTranspose3d", 5), ("torch.mean", 3)]:
        assert name in catalog, name
        assert rank in catalog[name].ranks, (name, catalog[name].ranks)
    assert catalog["nn.ConvTranspose2d"].category == "transposed_convolution"
    assert catalog["nn.Linear"].category == "linear"


def test_stochastic_operators_are_excluded_with_reason(catalog):
    for name in ("nn.Dropout", "nn.AlphaDropout", "nn.RReLU", "nn.Dropout2d", "F.rrelu"):
        assert name not in catalog
        assert "stochastic" in catalog.excluded[name] or "random" in catalog.excluded[name], catalog.excluded[name]


def test_every_excluded_candidate_has_a_reason(catalog):
    assert catalog.excluded and all(isinstance(r, str) and r for r in catalog.excluded.values())


def test_transformers_seeds_when_installed(catalog):
    pytest.importorskip("transformers")
    tf = catalog.names(source="transformers")
    assert len(tf) >= 10
    kinds = " ".join(tf)
    assert "RMSNorm" in kinds and "MLP" in kinds and "Attention" in kinds and "GELU" in kinds


def test_catalog_without_transformers(catalog):
    no_tf = load_catalog(False)
    assert not no_tf.names(source="transformers")
    assert no_tf.names(source="torch") == catalog.names(source="torch")


def test_cli_json_counts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "opsynth.catalog", "--json"], capture_output=True, text=True,
                         check=True, timeout=300)
    data = json.loads(out.stdout)
    assert data["total"] == len(data["ops"]) == sum(data["counts"].values())
    assert data["counts"]["convolution"] >= 3


def test_cli_text_lists_categories():
    out = subprocess.run([sys.executable, "-m", "opsynth.catalog", "--no-transformers"], capture_output=True,
                         text=True, check=True, timeout=300)
    assert "convolution (" in out.stdout and "operators in" in out.stdout


def test_cli_excluded_lists_every_left_out_candidate_with_its_reason(catalog):
    """README: `python -m opsynth.catalog --excluded` also lists the mined candidates left out, and why."""
    run = [sys.executable, "-m", "opsynth.catalog"]
    full = subprocess.run(run + ["--excluded"], capture_output=True, text=True, check=True, timeout=300).stdout
    plain = subprocess.run(run, capture_output=True, text=True, check=True, timeout=300).stdout
    _, _, listed = full.partition(f"{len(catalog.excluded)} candidates excluded (listed below)\n")
    assert listed, full[-2000:]
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in listed.splitlines() if ln.strip()}
    assert rows == catalog.excluded
    assert "(--excluded lists them)" in plain
    assert not any(f"  {name} " in plain for name in catalog.excluded)


def test_operators_that_give_nan_on_some_inputs_are_excluded_for_that_not_as_random(catalog):
    """log, sqrt, acos of a negative entry is NaN on every run: not randomness (NaN != NaN once made
    them look stochastic), but a domain no randn-fed task keeps to, which is the reason given."""
    for name in ("torch.log", "torch.sqrt", "torch.rsqrt", "torch.acos"):
        assert name not in catalog
        assert "not finite" in catalog.excluded[name] and "stochastic" not in catalog.excluded[name]
    # a name that merely starts like a random sampler's is not excluded for it
    assert "F.normalize" in catalog and "F.poisson_nll_loss" in catalog
    assert "random" in catalog.excluded["torch.poisson"]


def test_dtype_changing_operators_are_left_out(catalog):
    assert "torch.float_power" not in catalog  # float64 output: the next float32 weight rejects it


def test_docstring_signature_recovers_an_overload_the_overrides_hide(catalog):
    from opsynth.catalog.mine import docstring_params

    import torch

    assert [p.name for p in docstring_params(torch.logsumexp)] == ["input", "dim", "keepdim"]
    assert docstring_params(len) == []
    spec = catalog["torch.logsumexp"]
    assert spec.required == ("dim",) and spec.category == "reduction"
    assert catalog["torch.movedim"].ranks == (3, 4, 5)  # needs two non-batch dimensions
