"""Durable writes to a storage directory (autohet_ray/durable.py): every chunk, manifest and job file is fsynced, the
file and then its directory; job files use temporaries of their own, so concurrent writers never clobber
each other's; a torn last line of metrics.jsonl is skipped with a warning and never spliced into the next."""
import json
import os
import stat
import threading

import pytest

from autohet_ray.checkpoint.tier_specs import direct_tier
from autohet_ray import durable
from autohet_ray.storage.job_files import JOB_FILE, LineLog, read_lines, read_metrics, read_text, write_text
from autohet_ray.storage.spec import storage_spec


@pytest.fixture
def fsyncs(monkeypatch):
    """Every os.fsync call of the test: ("file" or "dir", the path it synced)."""
    calls, real = [], os.fsync

    def recording_fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        calls.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    return calls


def test_a_chunk_and_a_manifest_are_fsynced_file_then_directory(tmp_path, fsyncs):
    tier = direct_tier(storage_spec(str(tmp_path / "run")))                 # a dir storage: fsync by default
    tier.put_chunk("step-0000000001/w/0-4", b"\x01" * 64)
    chunk_dir = str(tmp_path / "run" / "step-0000000001" / "w")
    assert fsyncs[-1] == ("dir", chunk_dir)                                  # the rename made durable
    assert fsyncs[-2][0] == "file" and fsyncs[-2][1].startswith(chunk_dir + "/.0-4.tmp-")   # data before rename
    made = [path for kind, path in fsyncs[:-2]]                              # each new directory's entry
    assert made == [str(tmp_path / "run"), str(tmp_path / "run" / "step-0000000001")], fsyncs
    fsyncs.clear()
    tier.put_manifest(1, b"{}")
    assert [kind for kind, _ in fsyncs] == ["dir", "file", "dir"]           # manifests/ made, body, link
    assert fsyncs[-1] == ("dir", str(tmp_path / "run" / "manifests"))
    assert (tmp_path / "run" / "step-0000000001" / "w" / "0-4").read_bytes() == b"\x01" * 64


def test_node_stores_and_an_explicit_switch_skip_fsync(tmp_path, fsyncs):
    direct_tier({"kind": "keeper", "name": "keeper-a", "dir": str(tmp_path / "shm")}).put_chunk("k/x", b"1")
    direct_tier(storage_spec(str(tmp_path / "d")) | {"fsync": False}).put_chunk("k/x", b"1")
    assert fsyncs == []


def test_job_files_are_fsynced_and_leave_no_temporary(tmp_path, fsyncs):
    spec = storage_spec(str(tmp_path / "run"))
    os.makedirs(spec["path"])
    write_text(spec, JOB_FILE, '{"job_id": "a"}')
    assert fsyncs[0][0] == "file" and "/.job.json.tmp-" in fsyncs[0][1]
    assert fsyncs[1:] == [("dir", spec["path"])]
    assert os.listdir(spec["path"]) == [JOB_FILE]


def test_two_concurrent_writers_of_one_job_file_never_share_a_temporary(tmp_path):
    spec = storage_spec(str(tmp_path))
    bodies = {who: json.dumps({"job_id": who, "pad": who * 4096}) for who in "ab"}
    errors, start = [], threading.Barrier(2)

    def writer(who):
        start.wait()
        try:
            for _ in range(200):
                write_text(spec, JOB_FILE, bodies[who])
                assert read_text(spec, JOB_FILE) in bodies.values()          # whole, never a mix
        except Exception as err:       # noqa: BLE001 - reported by the assertion below
            errors.append(repr(err))
    threads = [threading.Thread(target=writer, args=(who,)) for who in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert read_text(spec, JOB_FILE) in bodies.values() and os.listdir(tmp_path) == [JOB_FILE]


def test_a_torn_last_line_is_skipped_with_a_warning_and_not_spliced(tmp_path, capsys):
    spec = storage_spec(str(tmp_path))
    log = LineLog(spec, "metrics.jsonl")
    log.append('{"step": 1}')
    with open(tmp_path / "metrics.jsonl", "a") as f:                         # a writer died mid-line
        f.write('{"step": 2, "lo')
    assert read_lines(spec) == ['{"step": 1}']
    assert "skipped a torn last line (15 bytes" in capsys.readouterr().err
    LineLog(spec, "metrics.jsonl").append('{"step": 2}')                     # the resumed job appends
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2, "lo\n{"step": 2}\n'
    assert read_metrics(spec) == [{"step": 1}, {"step": 2}]                  # the torn line is its own
    assert "skipped line 2, not a JSON object" in capsys.readouterr().err


def test_append_line_writes_whole_lines_and_fsyncs(tmp_path, fsyncs):
    path = tmp_path / "log"
    durable.append_line(path, "one")
    assert fsyncs == [("file", str(path)), ("dir", str(tmp_path))]          # a new file: its entry too
    durable.append_line(path, "two")
    assert fsyncs[2:] == [("file", str(path))] and path.read_text() == "one\ntwo\n"
    with pytest.raises(AssertionError):
        durable.append_line(path, "three\nfour")
