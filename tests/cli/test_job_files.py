"""The worked job files in jobs/ each train a step in emulation, as a user runs them: `autohet train --config
jobs/<name>.yaml` from a working directory holding `jobs/`, with `--steps 1` the only override (the main job also
gets a shorter emulated iteration). The Hugging Face fine-tune first gets its inputs as its own comments say: a
Hugging Face Llama with its tokenizer in out/hf-model, and `autohet data prepare --tokenizer out/hf-model`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def autohet(cwd, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "autohet_ray.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def train_one_step(cwd, config: str, *overrides: str) -> tuple[dict, dict]:
    """(the run's JSON summary, the job record in its storage) of `autohet train --config config --steps 1`."""
    done = autohet(cwd, "train", "--config", config, "--steps", "1", "--json", *overrides)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [s["step"] for s in out["steps"]] == [1] and out["secured"]["step"] == 1 and out["emulated"]
    with open(os.path.join(cwd, config)) as f:
        storage = yaml.safe_load(f)["storage"]
    with open(os.path.join(cwd, storage, "job.json")) as f:
        return out, json.load(f)["job"]


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "jobs").symlink_to(os.path.join(REPO, "jobs"))
    return tmp_path


def test_the_main_job_trains_a_step(workdir):
    out, job = train_one_step(workdir, "jobs/paper-24.yaml", "--iteration-wall-s", "1")
    assert job["model"]["name"] == "small-gpt" and job["global_batch"] == 48
    assert sum(n["count"] for n in job["cluster"]["nodes"]) == 24 and not job["elastic"]
    assert out["storage_committed"] == [1]


def test_the_elastic_spot_job_trains_a_step(workdir):
    out, job = train_one_step(workdir, "jobs/paper-24-spot.yaml")
    assert job["elastic"] and job["spot_watch"] and job["spot_provider"] == "aws"   # what `resume` reads
    assert sum(n["count"] for n in job["cluster"]["nodes"]) == 24 and job["optimizer"]["decay"] == "cosine"
    assert out["committed"] == [1] and out["storage_committed"] == [1]        # in two nodes' stores and storage


def _hf_model_with_tokenizer(path, corpus) -> None:
    """A small Llama saved by transformers, with a byte-level BPE trained on the corpus as its tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from autohet_ray.data.tokenize import tokenizer_from_json, train_byte_level_bpe, vocab_size_of
    text = train_byte_level_bpe((p.read_text() for p in sorted(corpus.iterdir())), 320)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size_of(tokenizer_from_json(text)), hidden_size=32,
                                      intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    (path / "tokenizer.json").write_text(text)


def test_the_hugging_face_fine_tune_trains_a_step(workdir):
    corpus = workdir / "corpus"
    corpus.mkdir()
    stdlib = sorted((p for p in os.scandir(sysconfig.get_paths()["stdlib"]) if p.name.endswith(".py")),
                    key=lambda p: p.name)
    for entry in [e for e in stdlib if 2_000 < e.stat().st_size < 20_000][:8]:
        (corpus / entry.name).write_bytes(open(entry.path, "rb").read())
    _hf_model_with_tokenizer(workdir / "out" / "hf-model", corpus)
    autohet(workdir, "data", "prepare", "--input", "corpus", "--tokenizer", "out/hf-model", "--out", "out/hf-data",
            "--val-fraction", "0.1", "--workers", "1")
    out, job = train_one_step(workdir, "jobs/hf-finetune.yaml")
    assert out["launch"]["init_from_bytes"] > 0                    # step 0 started from the HF weights
    assert job["model"]["family"] == "llama" and job["init_from"] == str(workdir / "out" / "hf-model")
    assert job["data"] == "out/hf-data" and job["optimizer"]["lr"] == 1e-4


def test_jobs_train_py_takes_a_job_file(workdir):
    """`jobs/train.py`, the script `ray job submit` runs, reads a job file and its flag overrides too."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, os.path.join(REPO, "jobs", "train.py"), "--config", "jobs/paper-24.yaml",
                           "--no-emulate", "--steps", "7", "--print-config"], cwd=workdir, text=True,
                          capture_output=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    job = yaml.safe_load(done.stdout)
    assert job["steps"] == 7 and job["emulate"] is False and job["model"]["name"] == "small-gpt"
