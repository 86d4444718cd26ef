"""Hugging Face import/export against transformers itself, on tiny random models made here (never downloaded)."""
import json

import pytest
import torch
from safetensors import safe_open

transformers = pytest.importorskip("transformers")

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.nn import build_model  # noqa: E402
from autohet_ray.model.hf_config import spec_from_hf_config  # noqa: E402
from autohet_ray.nn.hf import hf_to_local, load_hf_dir, local_to_hf, read_slice, save_hf_dir  # noqa: E402

VOCAB, SEQ = 128, 12


def _hf_model(kind: str):
    torch.manual_seed(0)
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, rope_theta=500000.0,
                                                                       rms_norm_eps=1e-6, tie_word_embeddings=False))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small, rope_theta=1e6,
                                                                       tie_word_embeddings=True))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2,
                                                                     n_head=4, n_positions=32,
                                                                     bos_token_id=0, eos_token_id=0))
    with torch.no_grad():       # move away from the zero biases / unit norms of a fresh init
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.float().eval()


def _hf_state(model) -> dict:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _ours(spec, state):
    model = build_model(spec).float().eval()
    model.load_state_dict(state, strict=True)
    return model


def _ids():
    return torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(1))


def _read_dir(path) -> dict:
    index = path / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    out = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            out.update({n: f.get_tensor(n) for n in f.keys()})
    return out


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_logits_match_transformers(kind):
    hf = _hf_model(kind)
    spec = spec_from_hf_config(hf.config.to_dict(), kind)
    ours = _ours(spec, hf_to_local(_hf_state(hf), spec))
    ids = _ids()
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    assert want.abs().max() > 0.5                       # the comparison is not between near-zero logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_spec_fields(kind):
    spec = spec_from_hf_config(_hf_model(kind).config.to_dict(), kind)
    if kind == "llama":
        assert (spec.family, spec.num_kv_heads, spec.rope_theta, spec.norm_eps, spec.tie_embeddings) == \
            ("llama", 2, 500000.0, 1e-6, False)
    else:
        assert (spec.family, spec.activation, spec.tie_embeddings, spec.max_seq_len) == ("gpt", "gelu_tanh", True, 32)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_round_trip_through_directories(kind, tmp_path):
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path / "in")
    spec, state = load_hf_dir(str(tmp_path / "in"))
    files = save_hf_dir(str(tmp_path / "out"), spec, state, max_shard_bytes=20_000)
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"

    # import then export is bit-exact: the same tensors, names and dtypes as transformers wrote
    original, exported = _read_dir(tmp_path / "in"), _read_dir(tmp_path / "out")
    assert set(exported) == set(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    # and our layout round-trips bit for bit too
    again = hf_to_local(local_to_hf(state, spec), spec)
    assert set(again) == set(state) and all(torch.equal(again[n], state[n]) for n in state)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(reloaded(ids).logits, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(_ours(spec, state)(ids), want, atol=1e-4, rtol=0)


def test_read_slice_reads_one_region(tmp_path):
    hf = _hf_model("llama")
    hf.save_pretrained(tmp_path)
    name = "model.layers.1.self_attn.q_proj.weight"
    got = read_slice(str(tmp_path), name, (slice(8, 16), slice(None)))
    assert torch.equal(got, hf.state_dict()[name][8:16])


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
    ({"model_type": "falcon"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_unsupported_fields_are_refused_by_name(change, field):
    config = {**_hf_model("llama").config.to_dict(), **change}
    with pytest.raises(ConfigError, match=field):
        spec_from_hf_config(config, "x")


def test_checkpoint_that_does_not_match_its_config_is_refused():
    hf = _hf_model("gpt2")
    spec = spec_from_hf_config(hf.config.to_dict(), "g")
    state = _hf_state(hf)
    del state["transformer.h.1.attn.c_attn.bias"]
    with pytest.raises(ConfigError, match="c_attn.bias"):
        hf_to_local(state, spec)


# ---- per-rank loading (--init-from) ------------------------------------------------------------------------

class _CountingOpen:
    """Stands in for safetensors.safe_open: counts the bytes of every slice read, refuses whole-tensor reads."""

    def __init__(self, log: list):
        self.log = log

    def __call__(self, file, framework):
        handle, log = safe_open(file, framework=framework), self.log

        class Guarded:
            def get_slice(self, name):
                inner = handle.get_slice(name)

                class Sliced:
                    def get_shape(self):
                        return inner.get_shape()

                    def __getitem__(self, index):
                        out = inner[index]
                        log.append((name, out.numel() * out.element_size()))
                        return out
                return Sliced()

            def get_tensor(self, name):
                raise AssertionError(f"whole tensor {name} read")
        return Guarded()


def _stage_layout(spec, layers, first, last, tp, tp_rank):
    from autohet_ray.nn import StageModel
    from autohet_ray.runtime.parallelize import param_chunk
    with torch.device("meta"):
        model = StageModel(spec, layers=layers, first=first, last=last)
    return {n: (tuple(p.shape), param_chunk(n, tuple(p.shape), tp, tp_rank)) for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind, tp", [("llama", 2), ("gpt2", 4), ("qwen2", 2)])
def test_each_rank_reads_only_its_slices(kind, tp, tmp_path, monkeypatch):
    from autohet_ray.checkpoint import hf_weights
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path)
    spec = spec_from_hf_config(hf.config.to_dict(), kind)
    full = hf_to_local(_hf_state(hf), spec)
    log = []
    monkeypatch.setattr(hf_weights, "safe_open", _CountingOpen(log))
    # a first stage (embedding, layer 0) and a last stage (layer 1, head) of a two-stage pipeline
    for layers, first, last in (((0, 1), True, False), ((1, 2), False, True)):
        for tp_rank in range(tp):
            layout = _stage_layout(spec, layers, first, last, tp, tp_rank)
            log.clear()
            state, nbytes = hf_weights.load_rank_state(str(tmp_path), spec, layout)
            assert set(state) == set(layout)
            for name, (tensor, shape, chunk) in state.items():
                assert tensor.dtype == full[name].dtype and torch.equal(tensor, full[name][chunk.slices()]), name
            held = sum(c.numel for _, c in layout.values()) * 4
            # every byte read is one this rank holds, read once
            assert nbytes == sum(b for _, b in log) == held
            assert held < sum(t.numel() for t in full.values()) * 4 / tp + 1


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_fused_rows_map_to_slices_for_any_chunk(kind, tmp_path):
    """Chunks that do not fall on head or column boundaries (the layout algebra allows any rows)."""
    from autohet_ray.checkpoint.hf_weights import load_rank_state
    from autohet_ray.layout import Chunk
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path)
    spec = spec_from_hf_config(hf.config.to_dict(), kind)
    full = hf_to_local(_hf_state(hf), spec)
    names = ["layers.1.attn.qkv.weight", "layers.1.attn.qkv.bias" if kind == "gpt2" else "layers.1.mlp.gate_up.weight"]
    for lo, hi in ((0, 1), (3, 17), (5, 6), (7, 40)):
        layout = {}
        for n in names:
            shape = tuple(full[n].shape)
            layout[n] = (shape, Chunk((lo,) + (0,) * (len(shape) - 1), (hi - lo,) + shape[1:]))
        state, _ = load_rank_state(str(tmp_path), spec, layout)
        for n in names:
            assert torch.equal(state[n][0], full[n][lo:hi]), (n, lo, hi)


def test_init_from_refuses_another_model(tmp_path):
    from autohet_ray.checkpoint.hf_weights import load_rank_state
    from autohet_ray.model.spec import PRESETS
    _hf_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="num_layers=2 .job: 4"):
        load_rank_state(str(tmp_path), PRESETS["tiny-llama"], {})


def test_model_option_reads_hf_directories(tmp_path):
    from autohet_ray.model.spec import load_model
    hf = _hf_model("llama")
    hf.config.save_pretrained(tmp_path)
    spec = load_model(f"hf:{tmp_path}")
    assert spec == spec_from_hf_config(hf.config.to_dict(), tmp_path.name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ConfigError, match="hidden_act='relu'"):
        load_model(f"hf:{tmp_path}")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(f"hf:{tmp_path / 'nowhere'}")


# ---- export of a committed step ------------------------------------------------------------------------------

def _save_step(tier, step: int, rank_states: list[dict]) -> None:
    """Commit `step` of these rank states to `tier` the way workers do (snapshot, then the manifest)."""
    from autohet_ray.checkpoint import AsyncSnapshotter, SnapshotPolicy, assign_writers, commit_step
    holdings = {r: [(n, c, t.numel() * t.element_size()) for n, (t, _, c) in st.items()]
                for r, st in enumerate(rank_states)}
    owned = assign_writers(holdings)
    records = []
    for r, state in enumerate(rank_states):
        snap = AsyncSnapshotter(local=tier, policy=SnapshotPolicy(num_threads=1))
        records += snap.snapshot(step, state, owned=owned[r]).fast_result(timeout=60).records
        snap.close()
    commit_step(step, records, [tier])


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_export_of_a_committed_step_is_bit_exact(kind, tmp_path):
    """HF dir -> each rank's slices (a TP2 -> TP2 two-stage plan) -> a committed step -> export: the same
    tensors, bit for bit, and transformers loads the export."""
    from autohet_ray.checkpoint import LocalDirTier
    from autohet_ray.checkpoint.hf_export import export_step
    from autohet_ray.checkpoint.hf_weights import load_rank_state
    from autohet_ray.layout import Chunk
    hf = _hf_model(kind)
    hf.save_pretrained(tmp_path / "in")
    spec = spec_from_hf_config(hf.config.to_dict(), kind)
    states = []
    for layers, first, last in (((0, 1), True, False), ((1, 2), False, True)):
        for tp_rank in range(2):
            state, _ = load_rank_state(str(tmp_path / "in"), spec, _stage_layout(spec, layers, first, last, 2, tp_rank))
            state["optim.step"] = (torch.tensor(3.0, dtype=torch.float64), (), Chunk.whole(()))
            states.append(state)
    tier = LocalDirTier(str(tmp_path / "storage"), name="cloud")
    _save_step(tier, 3, states)
    report = export_step([tier], spec, str(tmp_path / "out"), max_shard_bytes=20_000)
    assert report.step == 3 and len(report.files) > 1 and report.bytes_fetched["cloud"] > 0
    original, exported = _read_dir(tmp_path / "in"), _read_dir(tmp_path / "out")
    assert set(exported) == set(original)
    for name, t in original.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(_ids()).logits, hf(_ids()).logits, atol=1e-4, rtol=0)
    with pytest.raises(ConfigError, match="not an empty directory"):
        export_step([tier], spec, str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="no committed step"):
        export_step([LocalDirTier(str(tmp_path / "empty"), name="cloud")], spec, str(tmp_path / "out2"))


def test_export_command_writes_the_jobs_tokenizer(tmp_path):
    """`autohet export` reads the model from the job record and the tokenizer from the job's dataset."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from autohet_ray.checkpoint import LocalDirTier
    from autohet_ray.checkpoint.hf_weights import load_rank_state
    from autohet_ray.cli import main
    hf = _hf_model("gpt2")
    hf.save_pretrained(tmp_path / "in")
    spec = spec_from_hf_config(hf.config.to_dict(), "g")
    state, _ = load_rank_state(str(tmp_path / "in"), spec, _stage_layout(spec, (0, 2), True, True, 1, 0))
    storage = tmp_path / "storage"
    _save_step(LocalDirTier(str(storage), name="cloud"), 2, [state])
    data = tmp_path / "data"
    data.mkdir()
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    (data / "tokenizer.json").write_text(tokenizer.to_str())
    (data / "index.json").write_text(json.dumps({"eos_id": 5}))      # the one field export reads
    (storage / "job.json").write_text(json.dumps({"job_id": "j", "job": {"model": spec.to_dict(), "data": str(data)}}))
    assert main(["export", "--storage", str(storage), "--out", str(tmp_path / "out"), "--max-shard-size", "1MB"]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert tokenizer("w3 w7")["input_ids"] == [3, 7]
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == 5
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(_ids()).logits, hf(_ids()).logits, atol=1e-4, rtol=0)
    assert main(["export", "--storage", str(tmp_path / "in"), "--out", str(tmp_path / "o2")]) == 2   # no job there


@pytest.mark.cli
def test_training_and_export_do_not_need_transformers():
    import subprocess
    import sys
    code = ("import sys; import autohet_ray.cli, autohet_ray.cli.train, autohet_ray.cli.export, "
            "autohet_ray.checkpoint.hf_weights, autohet_ray.checkpoint.hf_export, autohet_ray.runtime.engine, "
            "autohet_ray.orchestrate.controller, autohet_ray.orchestrate.worker; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
