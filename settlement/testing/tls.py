"""Certificates for a TLS listener: a private CA and a server certificate
signed by it, made with ``trustme`` and written as PEM files.

``settlement kafka --tls`` (:class:`settlement.testing.apache_kafka.KafkaCluster`)
gives its nodes the server file and its clients the CA file, as ``CaFile``
of their ``kafkas://`` connection strings. Files already there are kept: a
cluster started again keeps the CA its clients trust.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


@dataclass(frozen=True)
class CertificateFiles:
    """Where the PEM files are."""

    #: the CA's certificate: what clients trust (``CaFile=``)
    ca: Path
    #: the server's private key (PKCS#8, as Kafka's PEM key store reads it)
    #: followed by its certificate chain
    server: Path


def make_certificates(directory: Path, hosts: list[str]) -> CertificateFiles:
    """A CA and a certificate for ``hosts`` (names or IP addresses) in
    ``directory``, unless both files are there already."""
    files = CertificateFiles(directory / "ca.pem", directory / "server.pem")
    if files.ca.exists() and files.server.exists():
        return files
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="settlement layer development CA")
    leaf = ca.issue_cert(*hosts)
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    files.server.write_bytes(pkcs8 + b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    files.server.chmod(0o600)
    ca.cert_pem.write_to_path(str(files.ca))
    return files
