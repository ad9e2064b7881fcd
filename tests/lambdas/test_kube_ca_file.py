"""The Kubernetes CA bundle is written to a file once per content (urllib3 wants a path), in the
shared temporary directory: a file already there is used only when it holds exactly that
bundle, or anyone who can write there could plant a CA and pose as the cluster."""

from __future__ import annotations

import base64
import os

from sdc_remediation.clients import kube

PEM = b"-----BEGIN CERTIFICATE-----\nMIIBexample\n-----END CERTIFICATE-----\n"


def test_a_planted_file_at_the_cas_path_is_replaced_by_the_bundle(tmp_path, monkeypatch):
    # Given the path the bundle will have already holds someone else's CA
    monkeypatch.setattr(kube.tempfile, "gettempdir", lambda: str(tmp_path))
    b64 = base64.b64encode(PEM).decode()
    first = kube._ca_file(b64)
    with open(first, "wb") as fh:
        fh.write(b"-----BEGIN CERTIFICATE-----\nMIIBattacker\n-----END CERTIFICATE-----\n")

    # When the bundle is needed again (a warm Lambda, the next call)
    again = kube._ca_file(b64)

    # Then the file at the path holds exactly the bundle (superseded: the planted one was
    # trusted as it was), and no temporary file is left beside it
    assert again == first
    with open(again, "rb") as fh:
        assert fh.read() == PEM
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(first)]


def test_the_right_file_is_reused_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(kube.tempfile, "gettempdir", lambda: str(tmp_path))
    b64 = base64.b64encode(PEM).decode()
    path = kube._ca_file(b64)
    before = os.stat(path).st_mtime_ns
    assert kube._ca_file(b64) == path and os.stat(path).st_mtime_ns == before
