"""What a stopping or closing job prints about its newest committed step (recovery/exit_messages.py), from
plain data: where the step is, and the exact `autohet resume` command (no Ray, no job)."""
from __future__ import annotations

from autohet_ray.recovery.exit_messages import describe_places, not_in_storage_message, resume_command
from autohet_ray.storage.spec import storage_spec

S3 = storage_spec("s3://runs/job-7", endpoint_url="http://127.0.0.1:9000")
KEEPERS = {"a": {"name": "keeper-a", "dir": "/dev/shm/j/a"}, "b": {"name": "keeper-b", "dir": "/dev/shm/j/b"}}


def test_the_resume_command_names_the_storage_its_endpoint_and_an_unreached_target():
    assert resume_command(S3, 4, 10) == \
        "autohet resume --storage s3://runs/job-7 --endpoint-url http://127.0.0.1:9000 --steps 10"
    assert resume_command(storage_spec("/ckpt/run/"), 10, 10) == "autohet resume --storage /ckpt/run"
    assert resume_command(storage_spec("/ckpt/run"), 3, None) == "autohet resume --storage /ckpt/run"


def test_places_say_where_the_step_is_and_its_fewest_copies():
    assert describe_places(S3, {"step": None}) == "no step committed yet"
    both = {"step": 6, "stores": ["keeper-a"], "copies": 2, "in_storage": True}
    assert describe_places(S3, both) == \
        "committed step 6 is in node stores keeper-a and the storage s3://runs/job-7/ (2 copies of each chunk at least)"
    lost = {"step": 6, "stores": [], "copies": 0, "in_storage": False}
    assert describe_places(S3, lost) == "committed step 6 is in no live store (0 copies of each chunk at least)"


def _message(places: dict, newest_stored, error=None) -> list[str]:
    outcome = {"completed": 8} | ({"error": error} if error else {})
    return not_in_storage_message(outcome, places, storage=storage_spec("/ckpt/run"), newest_stored=newest_stored,
                                  keeper_specs=KEEPERS, job_id="j1", resume="autohet resume --storage /ckpt/run"
                                  ).split("\n")


def test_a_step_only_in_node_stores_names_their_directories_and_the_resume_command():
    lines = _message({"step": 8, "stores": ["keeper-b"], "copies": 1, "in_storage": False}, 4, "TimeoutError: slow")
    assert lines == [
        "autohet: step 8 did not reach the storage /ckpt/run (TimeoutError: slow); the newest step there is 4.",
        "autohet: committed step 8 is in node stores keeper-b (1 copy of each chunk at least), kept for job j1 "
        "(keeper-b: /dev/shm/j/b); while their nodes live, `autohet resume --storage /ckpt/run` continues from it."]


def test_without_a_node_store_copy_the_newest_stored_step_or_a_fresh_start_is_named():
    gone = {"step": 8, "stores": [], "copies": 0, "in_storage": False}
    assert _message(gone, 4)[1] == "autohet: `autohet resume --storage /ckpt/run` continues from step 4."
    assert _message({"step": None}, None) == [
        "autohet: step 8 did not reach the storage /ckpt/run; the newest step there is None.",
        "autohet: no step of this job was committed anywhere; `autohet train` starts it again."]
