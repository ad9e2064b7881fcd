"""The spool is one job's own: a private directory, only its records sent, rejects set aside."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest
from botocore.exceptions import ClientError, ParamValidationError, ReadTimeoutError

from sdc_agent.publish import PublishSettings
from sdc_agent.publish.events import Delivery
from sdc_agent.publish.retry import is_rejection
from sdc_agent.publish.spool import REJECTED_DIR, DeliveryFailed, Spool


def settings(base, job: str = "llama", cluster: str = "ml") -> PublishSettings:
    return PublishSettings(cluster_name=cluster, job_name=job, spool_dir=str(base))


def delivery(n: int, job: str = "llama", cluster: str = "ml") -> Delivery:
    return Delivery(
        kind="alarm",
        log_group=f"/sdc/{cluster}",
        log_stream=job,
        namespace="SDC",
        message=json.dumps({"n": n}),
        metrics=(
            {
                "MetricName": "sdc_nonfinite_grad",
                "Value": float(n),
                "Dimensions": [
                    {"Name": "ClusterName", "Value": cluster},
                    {"Name": "JobName", "Value": job},
                ],
            },
        ),
    )


def plant(directory, record: Delivery, name: str = "sdc-00000000T000000000000Z-1-planted") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.jsonl").write_text(json.dumps(record.to_record()) + "\n")


def test_each_job_spools_into_its_own_private_directory(tmp_path):
    # Given two jobs whose publishers share one spool directory (a hostPath on the node)
    mine, theirs = Spool.for_job(settings(tmp_path)), Spool.for_job(settings(tmp_path, "gpt"))
    # When each spools a record
    assert mine.put(delivery(1)) and theirs.put(delivery(2, job="gpt"))
    # Then each lives in its own subdirectory, mode 0700, owned by this user
    assert mine.directory.parent == tmp_path and mine.directory != theirs.directory
    for spool in (mine, theirs):
        info = spool.directory.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        assert len(spool.records()) == 1


def test_a_job_name_with_slashes_stays_one_directory_below_the_spool(tmp_path):
    spool = Spool.for_job(settings(tmp_path, job="../../etc/team/llama"))
    assert spool.put(delivery(1, job="../../etc/team/llama"))
    assert spool.directory.parent == tmp_path


def test_a_world_writable_spool_directory_is_refused_and_nothing_in_it_is_sent(tmp_path, caplog):
    # Given the job's spool directory is writable by everyone, and holds a record someone put there
    spool = Spool.for_job(settings(tmp_path))
    plant(spool.directory, delivery(666))
    spool.directory.chmod(0o777)
    sent: list[Delivery] = []
    # When the publisher spools and drains
    stored = spool.put(delivery(1))
    drained = spool.drain(sent.append)
    # Then it refuses the directory: nothing stored, nothing sent, one clear log line
    assert stored is False
    assert drained == (0, 0) and sent == []
    assert spool.records() == []
    assert "0777" in caplog.text and "not using it" in caplog.text
    assert caplog.text.count("not using it") == 1


def test_a_spool_directory_owned_by_another_user_is_refused(tmp_path, monkeypatch, caplog):
    # Given a spool directory created by another user (this process runs as a different uid)
    spool = Spool.for_job(settings(tmp_path))
    plant(spool.directory, delivery(666))
    spool.directory.chmod(0o700)
    monkeypatch.setattr(os, "geteuid", lambda: spool.directory.stat().st_uid + 1)
    sent: list[Delivery] = []
    # Then nothing is stored in it or sent from it
    assert spool.put(delivery(1)) is False
    assert spool.drain(sent.append) == (0, 0) and sent == []
    assert "is owned by uid" in caplog.text


def test_a_symbolic_link_as_spool_directory_is_refused(tmp_path, caplog):
    # Given the job's directory is a link to a directory someone else chose
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    plant(elsewhere, delivery(666))
    spool = Spool.for_job(settings(tmp_path / "spool"))
    spool.directory.parent.mkdir()
    spool.directory.symlink_to(elsewhere)
    sent: list[Delivery] = []
    assert spool.put(delivery(1)) is False
    assert spool.drain(sent.append) == (0, 0) and sent == []
    assert "symbolic link" in caplog.text


def test_a_record_another_job_planted_is_never_drained(tmp_path, caplog):
    # Given another job's record in the shared spool directory (the layout before per-job
    # directories), in that job's own directory, and one planted in this job's directory
    mine = Spool.for_job(settings(tmp_path))
    assert mine.put(delivery(5))
    plant(tmp_path, delivery(1, job="gpt"), name="sdc-00000000T000000000000Z-1-shared")
    assert Spool.for_job(settings(tmp_path, "gpt")).put(delivery(2, job="gpt"))
    plant(mine.directory, delivery(3, job="gpt"))
    forged = dataclasses.replace(delivery(4), metrics=delivery(4, cluster="other").metrics)
    plant(mine.directory, forged, name="sdc-00000000T000000000001Z-1-x")
    sent: list[Delivery] = []
    # When this job drains its spool
    assert mine.drain(sent.append) == (1, 0)
    # Then only its own record was sent
    assert sent == [delivery(5)]
    # And the others are where they were, or set aside unsent in this job's directory
    assert (tmp_path / "sdc-00000000T000000000000Z-1-shared.jsonl").exists()
    assert len(Spool.for_job(settings(tmp_path, "gpt")).records()) == 1
    assert sorted(p.name for p in mine.directory.glob("*.foreign")) == [
        "sdc-00000000T000000000000Z-1-planted.jsonl.foreign",
        "sdc-00000000T000000000001Z-1-x.jsonl.foreign",
    ]
    assert "not addressed to this job (its log stream is /sdc/ml/gpt)" in caplog.text
    assert "a metric has ClusterName='other'" in caplog.text
    # And a second drain sends nothing more
    assert mine.drain(sent.append) == (0, 0) and sent == [delivery(5)]


def test_a_record_aws_rejects_as_invalid_is_set_aside_once_and_never_resent(tmp_path, caplog):
    # Given three spooled records, the first of which AWS rejects as invalid
    spool = Spool.for_job(settings(tmp_path))
    for n in range(3):
        assert spool.put(delivery(n))
    calls: list[int] = []

    def send(d: Delivery) -> None:
        calls.append(json.loads(d.message)["n"])
        if json.loads(d.message)["n"] == 0:
            raise DeliveryFailed(
                d, "PutMetricData: InvalidParameterValue", transient=False, rejected=True
            )

    # When the spool is drained twice
    assert spool.drain(send) == (2, 0)
    assert spool.drain(send) == (0, 0)
    # Then the rejected record was tried once, then kept in rejected/ with its reason
    assert calls == [0, 1, 2]
    (kept,) = (spool.directory / REJECTED_DIR).glob("*.jsonl")
    assert spool.read(kept) == delivery(0)
    assert kept.with_name(kept.name + ".reason").read_text().strip() == (
        "PutMetricData: InvalidParameterValue"
    )
    assert "never sent again" in caplog.text


def test_rejected_records_count_against_the_spool_size(tmp_path):
    one = len(json.dumps(delivery(0).to_record(), separators=(",", ":"))) + 1
    spool = Spool.for_job(settings(tmp_path))
    spool.max_bytes = one
    assert spool.reject(delivery(0), "InvalidParameterValue")
    assert not spool.put(delivery(1))


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutMetricData",
    )


@pytest.mark.parametrize(
    ("exc", "rejected"),
    [
        (client_error("InvalidParameterValue", 400), True),
        (client_error("InvalidParameterCombination", 400), True),
        (client_error("MissingParameter", 400), True),
        (client_error("InvalidParameterException", 400), True),
        (ParamValidationError(report="Value must be a number"), True),
        # the caller's setup, which a fixed role or log group cures: the record waits
        (client_error("AccessDenied", 403), False),
        (client_error("AccessDeniedException", 400), False),
        (client_error("ResourceNotFoundException", 400), False),
        (client_error("ExpiredTokenException", 400), False),
        # AWS out of reach: retried
        (client_error("ThrottlingException", 400), False),
        (client_error("InternalFailure", 500), False),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), False),
        # our own bug: not the record's fault
        (ValueError("bug"), False),
    ],
)
def test_only_a_refusal_of_the_request_itself_is_a_rejection(exc, rejected):
    assert is_rejection(exc) is rejected
