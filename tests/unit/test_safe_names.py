"""No name read from a file escapes its directory: the validator itself, then a crafted dataset index (local and
on a real S3 API server), checkpoint manifest, Hugging Face index and job.json, each refused with one line that
names the file and the field, before any file outside the directory is read or written. Node stores live under
a private per-user root."""
import json
import os
import pathlib

import boto3
import pytest

from autohet_ray import ConfigError  # noqa: E402
from autohet_ray.safe_names import UnsafeNameError, path_inside, plain_name, relative_name  # noqa: E402
from crafted_inputs import Sentinel, crafted_names, hf_dir, index_with, manifest_with  # noqa: E402
from s3_server import CREDENTIALS, moto_endpoint  # noqa: E402

W = {"where": "/d/index.json", "field": "shards[0].file"}
GOOD_PLAIN = ["shard-00000.bin", "model-00001-of-00002.safetensors", "a..b", ".hidden", "layers.3.mlp.fc1.weight"]
BAD_PLAIN = [("", "is empty"), ("..", "'..' part"), (".", "'.' part"), ("../x", "holds a '/'"),
             ("/etc/group", "absolute path"), ("a/b", "holds a '/'"), ("a\x00b", "NUL"), ("a\\..\\b", "backslash"),
             (None, "must be a string"), (7, "must be a string"), (["x"], "must be a string")]
GOOD_SUB = ["a/b.bin", "a/b/c", "x..y/z"]
BAD_SUB = [("a/../../b", "'..' part"), ("/abs/x", "absolute path"), ("a//b", "empty part"), ("a/", "empty part"),
           ("./a", "'.' part"), ("a/\x00", "NUL"), ("", "is empty")]


@pytest.mark.parametrize("name", GOOD_PLAIN)
def test_plain_names_pass(name):
    assert plain_name(name, **W) == name and relative_name(name, **W) == name


@pytest.mark.parametrize("name, why", BAD_PLAIN)
def test_bad_plain_names_get_one_line_naming_file_field_and_value(name, why):
    with pytest.raises(UnsafeNameError) as err:
        plain_name(name, **W)
    text = str(err.value)
    assert why in text and text.startswith("/d/index.json: shards[0].file ") and repr(name) in text
    assert "\n" not in text and isinstance(err.value, ConfigError)          # exit 2 from the CLI


@pytest.mark.parametrize("name", GOOD_SUB)
def test_relative_sub_paths_pass_only_where_allowed(name):
    assert path_inside("/d", name, subpath=True, **W) == f"/d/{name}"
    if "/" in name:
        with pytest.raises(UnsafeNameError, match="holds a '/'"):
            path_inside("/d", name, **W)


@pytest.mark.parametrize("name, why", BAD_SUB)
def test_bad_sub_paths_are_refused(name, why):
    with pytest.raises(UnsafeNameError, match=why.replace(".", r"\.")):
        relative_name(name, **W)


# ---- crafted files ------------------------------------------------------------------------------------------

def test_a_local_index_naming_a_file_outside_is_refused(tmp_path):
    from autohet_ray.data import Dataset
    sentinel = Sentinel(tmp_path / "outside")
    data = tmp_path / "data"
    data.mkdir()
    for name in crafted_names(sentinel, data):
        (data / "index.json").write_text(json.dumps(index_with(name, sentinel.path.read_bytes())))
        with sentinel, pytest.raises(UnsafeNameError) as err:
            Dataset.open(str(data))
        assert str(err.value).startswith(f"{data / 'index.json'}: shards[0].file {name!r}"), err.value
        assert sentinel.untouched()
    (data / "shard-00000.bin").write_bytes(sentinel.path.read_bytes())        # the control: a plain name opens
    (data / "index.json").write_text(json.dumps(index_with("shard-00000.bin", sentinel.path.read_bytes())))
    assert Dataset.open(str(data)).index.num_tokens == 8


def test_an_s3_index_naming_a_file_outside_is_refused_before_the_download(tmp_path, monkeypatch):
    from autohet_ray.storage.datasets import download_dataset
    for key, env in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"), ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                     ("region_name", "AWS_DEFAULT_REGION")):
        monkeypatch.setenv(env, CREDENTIALS[key])
    sentinel = Sentinel(tmp_path / "outside")
    cache = tmp_path / "cache" / "ds"
    with moto_endpoint() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
        s3.create_bucket(Bucket="data")
        for name in crafted_names(sentinel, cache):
            s3.put_object(Bucket="data", Key=f"ds/{name.lstrip('/')}", Body=b"evil")
            s3.put_object(Bucket="data", Key="ds/index.json", Body=json.dumps(index_with(name, b"evil")).encode())
            with sentinel, pytest.raises(UnsafeNameError, match=r"index\.json: shards\[0\]\.file"):
                download_dataset("s3://data/ds", str(cache), endpoint_url=endpoint)
            assert sentinel.untouched() and not cache.exists()          # nothing written, not even the cache


@pytest.mark.parametrize("crafted", ["dotdot", "absolute", "offsets"])
def test_a_manifest_naming_a_chunk_outside_is_refused(crafted, tmp_path):
    from autohet_ray.checkpoint import latest_committed_step, load_manifest
    sentinel = Sentinel(tmp_path / "outside")
    names = dict(zip(("dotdot", "absolute"), crafted_names(sentinel, tmp_path / "ckpt" / "step-0000000001")))
    name = names.get(crafted, "w")
    chunk = {"offsets": ["../../outside/sentinel.bin"], "sizes": [2]} if crafted == "offsets" else None
    tier = manifest_with(tmp_path, name, chunk)
    field = "tensor name" if crafted != "offsets" else r"tensors\['w'\]\.chunks\[0\]\.chunk\.offsets"
    with sentinel, pytest.raises(UnsafeNameError, match=rf"^manifest manifests/step-0000000001\.json in tier "
                                                        rf"'cloud': {field}"):
        load_manifest(tier, 1)
    with sentinel, pytest.raises(UnsafeNameError):
        latest_committed_step([tier])             # refused, not skipped as if it were merely damaged
    assert sentinel.untouched()


def test_an_hf_index_naming_a_file_outside_is_refused(tmp_path):
    from autohet_ray.checkpoint.hf_weights import SliceReader, check_hf_dir
    from autohet_ray.model.spec import PRESETS
    from autohet_ray.nn.hf import INDEX_FILE, load_hf_dir
    hf = tmp_path / "hf"
    hf_dir(hf)
    check_hf_dir(str(hf), PRESETS["tiny-gpt"])                        # the control: it loads as written
    index = json.loads((hf / INDEX_FILE).read_text())
    sentinel = Sentinel(tmp_path / "outside")
    tensor = sorted(index["weight_map"])[0]
    for name in crafted_names(sentinel, hf):
        (hf / INDEX_FILE).write_text(json.dumps({**index, "weight_map": {**index["weight_map"], tensor: name}}))
        for load in (lambda: check_hf_dir(str(hf), PRESETS["tiny-gpt"]), lambda: SliceReader(str(hf)),
                     lambda: load_hf_dir(str(hf))):
            with sentinel, pytest.raises(UnsafeNameError) as err:
                load()
            assert str(err.value).startswith(f"{hf / INDEX_FILE}: weight_map[{tensor!r}] {name!r}"), err.value
            assert sentinel.untouched()


@pytest.mark.parametrize("job_id, why", [("../../outside", "holds a '/'"), ("/tmp/somewhere", "absolute path"),
                                         ("..", "'..' part"), (None, "must be a string")])
def test_a_job_id_that_is_no_plain_name_is_refused(job_id, why, tmp_path):
    from autohet_ray.job.record import read_job_record
    from autohet_ray.storage.spec import storage_spec
    (tmp_path / "job.json").write_text(json.dumps({"job_id": job_id, "job": {}}))
    with pytest.raises(UnsafeNameError, match=f"job.json: job_id .* {why}"):
        read_job_record(storage_spec(str(tmp_path)))


@pytest.mark.parametrize("text, why", [("{", "not valid JSON"), ("[]", "holds no job"), ('{"job_id": "a"}', "holds no job")])
def test_a_job_json_that_is_no_record_is_one_line(text, why, tmp_path):
    from autohet_ray.job.record import read_job_record
    from autohet_ray.storage.spec import storage_spec
    (tmp_path / "job.json").write_text(text)
    with pytest.raises(ConfigError, match=why):
        read_job_record(storage_spec(str(tmp_path)))


# ---- node stores ----------------------------------------------------------------------------------------------

def test_node_stores_live_in_a_private_root_of_this_user(tmp_path, monkeypatch):
    from autohet_ray.checkpoint.node_store import STORE_ENV, default_store_root, node_store_dir
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "new" / "root"))
    root = default_store_root()
    assert root == str(tmp_path / "new" / "root") and (os.stat(root).st_mode & 0o777) == 0o700
    assert node_store_dir("job1", "node1") == os.path.join(root, "job1", "node1")
    with pytest.raises(UnsafeNameError, match="job id '../x'"):
        node_store_dir("../x", "node1")
    monkeypatch.delenv(STORE_ENV)
    assert os.path.basename(default_store_root()) == f"autohet-{os.getuid()}"


def test_a_shared_or_foreign_store_root_is_refused(tmp_path, monkeypatch):
    from autohet_ray.checkpoint.node_store import STORE_ENV, default_store_root
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(STORE_ENV, str(shared))
    with pytest.raises(ConfigError, match="may be written by group or others .mode 777."):
        default_store_root()
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    monkeypatch.setenv(STORE_ENV, str(link))
    with pytest.raises(ConfigError, match="is not a directory .a link or a file."):
        default_store_root()
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(foreign, 65534, 65534)           # root makes a directory another user owns
    else:
        foreign = pathlib.Path("/")               # owned by root, not by this user
    monkeypatch.setenv(STORE_ENV, str(foreign))
    with pytest.raises(ConfigError, match=f"belongs to uid {foreign.stat().st_uid}, not to this user"):
        default_store_root()
