"""The Python API guards the storage as the CLI does: `Controller(job).run(steps)` holds the storage's lease and
refuses a storage that holds another job, before anything starts (no Ray session is needed to be refused)."""
import functools
import json

import pytest

from autohet_ray import ConfigError
from autohet_ray.job.config import TrainJob
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.storage.lease import storage_lease
from autohet_ray.storage.spec import storage_spec

CLUSTER = {"name": "one", "nodes": [{"name": "a", "device": "H800", "count": 1}]}


def job_on(storage) -> TrainJob:
    return TrainJob(model=load_model("tiny-gpt").to_dict(), cluster=CLUSTER, global_batch=4, storage=storage_spec(str(storage)))


def test_a_new_job_on_a_storage_holding_a_job_is_refused(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "job.json").write_text(json.dumps({"job_id": "older", "job": {}}))
    with pytest.raises(ConfigError, match=r"already holds job older .*autohet resume --storage"):
        Controller(job_on(storage)).run(1)
    assert json.loads((storage / "job.json").read_text())["job_id"] == "older"      # untouched


def test_a_storage_leased_by_another_run_is_refused(tmp_path, monkeypatch):
    import autohet_ray.orchestrate.controller as controller
    monkeypatch.setattr(controller, "storage_lease", functools.partial(storage_lease, wait_s=0.5))  # not 10 s
    storage = tmp_path / "storage"
    spec = storage_spec(str(storage))
    with storage_lease(spec, str(storage), job_id="holder"):
        with pytest.raises(ConfigError, match="holder"):
            Controller(job_on(storage)).run(1)
