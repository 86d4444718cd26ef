import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import CATALOG, cluster_from_dict, load_cluster
from autohet_ray.model import PRESETS, layer_params, load_model, model_from_dict

REQUIRED = ["A100-40GB", "A100-80GB", "H100", "H800", "H20", "H200", "L40S", "L20", "V100", "A10", "RTX-4090"]


def test_catalog_has_every_required_device_with_sources():
    for name in REQUIRED:
        dev = CATALOG[name]
        assert dev.bf16_tflops > 0 and dev.memory_gb > 0 and dev.hbm_gbps > 0 and dev.link_gbps > 0
        assert dev.source
    # the heterogeneity the paper exploits: H20 has more memory but ~6.7x less compute than H800
    assert CATALOG["H20"].memory_gb > CATALOG["H800"].memory_gb
    assert 6 < CATALOG["H800"].bf16_tflops / CATALOG["H20"].bf16_tflops < 7


def test_presets_load_and_replicas_expand():
    c = load_cluster("jobs/clusters/uneven-4-4-16.yaml")
    assert [n.name for n in c.nodes] == ["a100", "h800", "h20-0", "h20-1"]
    assert c.num_gpus == 24 and c.gpus_of("H20") == 16
    for name, gpus in [("paper-24", 24), ("uneven-16-4-4", 24), ("three-type-64", 64), ("four-type-256", 256),
                       ("mixed-1024", 1024)]:
        assert load_cluster(f"jobs/clusters/{name}.yaml").num_gpus == gpus


def test_nic_override_and_custom_device():
    c = cluster_from_dict({"name": "x", "network": {"inter_node_gbps": 400},
                           "nodes": [{"name": "a", "device": "MyGPU", "count": 2, "nic_gbps": 100}],
                           "devices": {"MyGPU": {"bf16_tflops": 100, "fp32_tflops": 10, "memory_gb": 16,
                                                 "hbm_gbps": 500, "link_gbps": 64, "link_kind": "pcie",
                                                 "nic_gbps": 100}}})
    assert c.nic_bytes_per_s("a") == 100e9 / 8
    assert c.device("MyGPU").memory_bytes == 16e9


@pytest.mark.parametrize("raw, fragment", [
    ({"name": "x", "nodes": []}, "no nodes"),
    ({"name": "x", "nodes": [{"name": "a", "device": "B200", "count": 8}]}, "unknown device 'B200'"),
    ({"name": "x", "nodes": [{"name": "a", "device": "H20", "count": 0}]}, "count=0"),
    ({"name": "x", "nodes": [{"name": "a", "device": "H20", "count": 8, "gpus": 8}]}, "unknown keys ['gpus']"),
    ({"name": "x", "nodes": [{"name": "a", "device": "H20", "count": 8}, {"name": "a", "device": "H20", "count": 8}]},
     "appears twice"),
    ({"name": "x", "nodes": [{"name": "a", "device": "H20", "count": 8}], "network": {"inter_node_gbps": -1}},
     "inter_node_gbps=-1"),
    ({"name": "x", "nodes": [{"name": "a", "device": "X", "count": 8}], "devices": {"X": {"bf16_tflops": 1}}},
     "missing fields"),
])
def test_cluster_errors_name_the_bad_value(raw, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        cluster_from_dict(raw)
    assert fragment in str(info.value)


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [ {name: a\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_cluster(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster(str(tmp_path / "missing.yaml"))


def _total_params(spec):
    return spec.num_layers * layer_params(spec, "layer") + layer_params(spec, "embedding") + layer_params(spec, "head")


@pytest.mark.parametrize("name, billions", [("gpt3-1.3b", 1.3), ("gpt3-2.7b", 2.7), ("gpt3-6.7b", 6.7),
                                            ("gpt3-13b", 13.0), ("llama-7b", 6.7), ("llama-13b", 13.0),
                                            ("llama2-70b", 69.0), ("bert-large", 0.34)])
def test_preset_parameter_counts_match_published_sizes(name, billions):
    # untied output projections add vocab*hidden over the published (tied) counts of GPT-3/BERT
    spec = PRESETS[name]
    untied = spec.vocab_size * spec.hidden if spec.family != "llama" else 0
    assert abs((_total_params(spec) - untied) / 1e9 - billions) / billions < 0.08


def test_llama_layer_params_by_hand():
    spec = PRESETS["llama2-70b"]
    h, kv, f = 8192, 8 * 128, 28672
    assert layer_params(spec, "layer") == 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h


def test_custom_model_yaml_and_errors(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: mine\nfamily: gpt\nnum_layers: 6\nhidden: 64\nnum_heads: 4\nffn_hidden: 256\n"
                    "vocab_size: 512\nmax_seq_len: 32\n")
    spec = load_model(str(path))
    assert spec.num_kv_heads == 4 and spec.num_layers == 6
    with pytest.raises(ConfigError, match="unknown model 'gpt5'"):
        load_model("gpt5")
    with pytest.raises(ConfigError, match="family='rnn'"):
        model_from_dict({**spec.to_dict(), "family": "rnn"})
    with pytest.raises(ConfigError, match="TP degree 3"):
        spec.check_tp(3)
