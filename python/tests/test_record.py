"""A time evaluator's result recorded in the tracker's results store from
Python (record=True, label=), read back with kiln results."""

import json
import subprocess

import pytest

import kiln


def test_time_evaluator_records_its_result(fleet, remote):
    dev = remote.cpu(0)
    a = kiln.nd.empty((4, 8), "float32", dev)
    echo = remote.get_function("rpcserver.echo")
    timer = echo.time_evaluator(number=5, repeat=3, record=True, label="py-record")
    r = timer(a)
    assert len(r.results) == 3
    assert r.record_id.startswith("r-"), r.record_id
    out = subprocess.run(
        [fleet.binary, "results", "show", r.record_id, "--tracker", fleet.tracker_addr, "--token-file", fleet.token_file, "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    got = json.loads(out)
    assert got["function"] == "rpcserver.echo"
    assert got["label"] == "py-record"
    assert got["source"] == "time_evaluator"
    assert got["device_key"] == "cpu"
    assert got["inputs"] == ["arg0:float32[4,8]"]
    assert got["time"]["results"] == r.results

    # Without record, nothing is recorded and there is no id.
    assert echo.time_evaluator(number=1, repeat=1)(a).record_id == ""


def test_record_needs_a_leased_session():
    local = kiln.local()
    with pytest.raises(kiln.KilnError, match="leased from a tracker"):
        kiln.runtime.TimeEvaluator(kiln.runtime.Function(0, None, "f", local), 1, 1, 0, record=True)


def test_label_is_checked(remote):
    echo = remote.get_function("rpcserver.echo")
    with pytest.raises(kiln.KilnError, match="at most 128"):
        echo.time_evaluator(record=True, label="x" * 200)
