"""Publisher configuration: arguments over the pod's environment, clear errors naming the value."""

from __future__ import annotations

import pytest

from sdc_agent.publish import PublishConfigError, PublishSettings, RetryPolicy
from sdc_agent.publish.settings import default_spool_dir


def test_environment_of_a_pytorchjob_pod_is_enough():
    # Given the variables docs/agent-install.md tells a PyTorchJob to set
    env = {"SDC_CLUSTER_NAME": "ml-cluster", "SDC_JOB_NAME": "llama-70b", "NODE_NAME": "n"}
    # When settings are read with no arguments
    settings = PublishSettings.from_env(env)
    # Then the contract's defaults follow from the cluster name
    assert settings.cluster_name == "ml-cluster"
    assert settings.job_name == "llama-70b"
    assert settings.namespace == "SDC"
    assert settings.log_group == "/sdc/ml-cluster"
    assert settings.spool_dir == default_spool_dir()
    assert settings.liveness_interval == 60.0


def test_arguments_override_the_environment():
    # Given an environment naming one cluster, job, namespace, group and spool
    env = {
        "SDC_CLUSTER_NAME": "env-cluster",
        "SDC_JOB_NAME": "env-job",
        "SDC_METRIC_NAMESPACE": "EnvNS",
        "SDC_LOG_GROUP": "/env/group",
        "SDC_SPOOL_DIR": "/env/spool",
    }
    # When arguments name others
    settings = PublishSettings.from_env(
        env,
        cluster_name="c",
        job_name="j",
        namespace="N",
        log_group="/g",
        spool_dir="/s",
        region="eu-west-1",
    )
    # Then the arguments win
    assert (settings.cluster_name, settings.job_name, settings.namespace) == ("c", "j", "N")
    assert (settings.log_group, settings.spool_dir, settings.region) == ("/g", "/s", "eu-west-1")


def test_environment_overrides_defaults():
    env = {
        "SDC_CLUSTER_NAME": "c",
        "SDC_JOB_NAME": "j",
        "SDC_METRIC_NAMESPACE": "Custom",
        "SDC_LOG_GROUP": "/custom/group",
        "SDC_SPOOL_DIR": "/var/spool/sdc",
        "SDC_SPOOL_MAX_BYTES": "1024",
    }
    settings = PublishSettings.from_env(env)
    assert settings.namespace == "Custom"
    assert settings.log_group == "/custom/group"
    assert settings.spool_dir == "/var/spool/sdc"
    assert settings.spool_max_bytes == 1024


def test_missing_cluster_name_names_the_variable():
    # Given a pod without SDC_CLUSTER_NAME
    with pytest.raises(PublishConfigError, match="SDC_CLUSTER_NAME"):
        # When settings are read without a cluster_name argument; Then the error says what to set
        PublishSettings.from_env({"SDC_JOB_NAME": "j"})


def test_missing_job_name_names_the_variable():
    with pytest.raises(PublishConfigError, match="SDC_JOB_NAME"):
        PublishSettings.from_env({"SDC_CLUSTER_NAME": "c", "HOSTNAME": "my-laptop"})


@pytest.mark.parametrize(
    ("env", "job"),
    [
        ({"POD_NAME": "llama-70b-worker-12"}, "llama-70b"),
        ({"HOSTNAME": "bert-ft-master-0"}, "bert-ft"),
        ({"POD_NAME": "a-b-c-worker-3", "HOSTNAME": "x-worker-1"}, "a-b-c"),
    ],
)
def test_job_name_falls_back_to_the_kubeflow_pod_name(env, job):
    # Given a Kubeflow replica pod "<job>-<replica type>-<index>" and no SDC_JOB_NAME
    settings = PublishSettings.from_env({"SDC_CLUSTER_NAME": "c", **env})
    # Then the job name is the pod name's prefix
    assert settings.job_name == job


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"job_name": "a:b"}, "log stream"),
        ({"job_name": "a*"}, "log stream"),
        ({"cluster_name": "bad name"}, "cluster_name"),
        ({"namespace": "AWS/EC2"}, "AWS/"),
        ({"log_group": "no spaces allowed"}, "log_group"),
        ({"queue_size": 0}, "queue_size"),
        ({"liveness_interval": 0}, "liveness_interval"),
        ({"read_timeout": float("nan")}, "read_timeout"),
        ({"spool_max_bytes": -1}, "spool_max_bytes"),
    ],
)
def test_invalid_values_are_refused_with_their_name(kwargs, message):
    base = {"cluster_name": "c", "job_name": "j"}
    with pytest.raises(PublishConfigError, match=message):
        PublishSettings(**{**base, **kwargs})


def test_spool_size_from_environment_must_be_a_number():
    env = {"SDC_CLUSTER_NAME": "c", "SDC_JOB_NAME": "j", "SDC_SPOOL_MAX_BYTES": "lots"}
    with pytest.raises(PublishConfigError, match="SDC_SPOOL_MAX_BYTES"):
        PublishSettings.from_env(env)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempts": 0}, "attempts"),
        ({"base_delay": -1}, "base_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
    ],
)
def test_retry_policy_is_validated(kwargs, field):
    with pytest.raises(PublishConfigError, match=field):
        RetryPolicy(**kwargs)


def test_aws_region_is_honoured_though_boto3_reads_only_aws_default_region():
    # Given a pod with AWS_REGION (set by the EKS webhooks) but no AWS_DEFAULT_REGION
    env = {"SDC_CLUSTER_NAME": "c", "SDC_JOB_NAME": "j", "AWS_REGION": "eu-west-1"}
    # Then the publisher uses it; an explicit region still wins
    assert PublishSettings.from_env(env).region == "eu-west-1"
    assert PublishSettings.from_env(env, region="us-east-2").region == "us-east-2"
    assert PublishSettings.from_env({**env, "AWS_REGION": ""}).region is None
