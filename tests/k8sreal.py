"""The Kubernetes real tier: a real kube-apiserver, etcd and a kwok node on loopback (no pytest here).

The binaries are built from Kubernetes' own Go modules by ``tools/k8s_bed/build.sh`` into
``$K8S_BED/bin`` (default ``~/.cache/remote-exec/k8s-bed/bin``); a cold build takes ~11 minutes
on 2 cores, so a machine builds once and keeps them (``make k8s-bed``). :func:`bed_bin` says
whether they are there.

:class:`RealCluster` starts etcd, the API server (TLS from a CA made here with
``cryptography``, RBAC, service-account keys) and kwok (one fake node, ``rx-node``, whose
pods are Running at once and whose exec runs the command as a local process, through the
kubelet's own streaming code), each on a free port in a temporary directory, and writes an
admin kubeconfig. Known kwok v0.8.0 exec limits (measured): a non-zero exit code comes back as
an ``InternalError`` (no ``ExitCode`` cause), the command's stdin never reaches EOF, and an
exec'd process outlives its client; they are marked by ``RX_KWOK_EXEC`` in their environment
and killed by :meth:`RealCluster.stop`.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["RealCluster", "bed_bin", "shared_real_cluster"]

ROOT = Path(__file__).resolve().parent.parent
KWOK_CONFIG = ROOT / "tools" / "k8s_bed" / "kwok.yaml"
READY_TIMEOUT = 120.0
NODE = "rx-node"


def bed_bin() -> Path | None:
    """The directory holding kube-apiserver, etcd and kwok, or None when they were not built."""
    bed = os.environ.get("K8S_BED") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "remote-exec", "k8s-bed"
    )
    path = Path(bed) / "bin"
    return path if all((path / b).is_file() for b in ("kube-apiserver", "etcd", "kwok")) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_pki(d: Path) -> None:
    """A CA; the API server's and the kwok node's serving certificates; admin and the API
    server's kubelet client (both ``system:masters``); the service-account key pair."""
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def subject(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []
        return x509.Name(attrs)

    def builder(name: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = subject("rx-k8s-real-ca")
    ca = (
        builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(file: str, cn: str, org: str | None = None, server: bool = False, names: tuple[str, ...] = ()) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (
            builder(subject(cn, org), ca_name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if names:
            alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names if not n[0].isdigit()]
            alt += [x509.IPAddress(ipaddress.ip_address(n)) for n in names if n[0].isdigit()]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        (d / f"{file}.crt").write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        (d / f"{file}.key").write_bytes(_pem_key(key))

    leaf("apiserver", "kube-apiserver", server=True, names=("localhost", "kubernetes", "127.0.0.1", "10.96.0.1"))
    leaf("kubelet", NODE, server=True, names=("localhost", NODE, "127.0.0.1"))
    leaf("apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters")
    leaf("admin", "admin", org="system:masters")
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "sa.key").write_bytes(_pem_key(sa))
    (d / "sa.pub").write_bytes(
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


class RealCluster:
    """etcd + kube-apiserver + kwok, started in ``root`` (see the module docstring).

    :ivar kubeconfig: the admin kubeconfig (client certificate).
    :ivar server: the API server's URL.
    """

    def __init__(self, root: Path, binaries: Path) -> None:
        self.root, self.bin = root, binaries
        self.pki = root / "pki"
        self.kubeconfig = root / "kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api_port, self.kwok_port = _free_port(), _free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        env = {**os.environ, "GOMAXPROCS": "1"}
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()

    def _wait(self, name: str, url: str, context: ssl.SSLContext | None = None) -> None:
        """Until ``url`` answers 200 (the process's readiness endpoint), bounded; a process that
        dies meanwhile fails at once with its log's end."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            proc = self.procs[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} did not become ready (exit {proc.returncode}): {tail}")
            time.sleep(0.2)  # a readiness probe of a process we do not control: no event to wait on

    def start(self) -> RealCluster:
        """Start all three and register the kwok node; return self.

        :raises RuntimeError: one of them did not become ready within :data:`READY_TIMEOUT`.
        """
        make_pki(self.pki)
        etcd, peer, metrics = _free_port(), _free_port(), _free_port()
        self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=rx",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=rx=http://127.0.0.1:{peer}",
                f"--listen-metrics-urls=http://127.0.0.1:{metrics}",
                "--unsafe-no-fsync",
            ],
        )
        self._wait("etcd", f"http://127.0.0.1:{etcd}/health")
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/12",
                "--authorization-mode=Node,RBAC",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={p / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
            ],
        )
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "real", "cluster": {"server": self.server, "certificate-authority": str(p / "ca.crt")}}
                    ],
                    "users": [
                        {
                            "name": "admin",
                            "user": {"client-certificate": str(p / "admin.crt"), "client-key": str(p / "admin.key")},
                        }
                    ],
                    "contexts": [{"name": "real", "context": {"cluster": "real", "user": "admin"}}],
                    "current-context": "real",
                }
            )
        )
        admin = ssl.create_default_context(cafile=str(p / "ca.crt"))
        admin.load_cert_chain(str(p / "admin.crt"), str(p / "admin.key"))
        self._wait("kube-apiserver", f"{self.server}/readyz", admin)
        config = KWOK_CONFIG.read_text().replace("@PKI@", str(p)).replace("@KWOK_PORT@", str(self.kwok_port))
        (self.root / "kwok.yaml").write_text(config)
        self._spawn(
            "kwok",
            [str(self.bin / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={self.root / 'kwok.yaml'}"],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        self._wait("kwok", f"https://127.0.0.1:{self.kwok_port}/healthz", insecure)
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux", "type": "kwok"},
                },
            },
            "/api/v1/nodes",
        )
        self.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            "/api/v1/namespaces/default/serviceaccounts",
        )
        return self

    def request(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> object:
        """One admin request to the API server; its JSON answer."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return json.load(r)

    def apply(self, obj: dict[str, object], collection: str) -> None:
        """Create ``obj`` in ``collection`` unless it exists (409)."""
        try:
            self.request("POST", collection, obj)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def pod(self, name: str, namespace: str = "default", volume: str | None = None) -> None:
        """A pod on the kwok node (no scheduler runs here: ``nodeName`` places it), once kwok
        has it running (``k8s://`` refuses a Pending pod, as ``kubectl exec`` does). ``volume``:
        an ``emptyDir`` mounted there (kwok mounts nothing: its execs run on this machine, so
        the path is one of this machine's)."""
        container: dict[str, object] = {"name": "main", "image": "fake"}
        spec: dict[str, object] = {"nodeName": NODE, "containers": [container]}
        if volume is not None:
            container["volumeMounts"] = [{"name": "state", "mountPath": volume}]
            spec["volumes"] = [{"name": "state", "emptyDir": {}}]
        self.apply(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec},
            f"/api/v1/namespaces/{namespace}/pods",
        )
        self._wait_running(name, namespace)

    @staticmethod
    def kill_exec_processes() -> int:
        """SIGKILL every process kwok's execs started (what a container's death does to its
        processes; kwok runs them on this machine): how many there were."""
        killed = 0
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if b"\0RX_KWOK_EXEC=rx\0" in b"\0" + environ.read_bytes():
                    os.kill(int(environ.parent.name), signal.SIGKILL)
                    killed += 1
            except (OSError, ValueError):
                pass
        return killed

    def _wait_running(self, name: str, namespace: str) -> None:
        """Follow the pod's watch (its current state first) until it is Running."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        path = f"/api/v1/namespaces/{namespace}/pods?watch=1&fieldSelector=metadata.name%3D{name}"
        with urllib.request.urlopen(f"{self.server}{path}", timeout=30, context=context) as r:
            for line in r:  # one event per line; the first ones are the pod as it is now
                pod = json.loads(line).get("object") or {}
                if (pod.get("status") or {}).get("phase") == "Running":
                    return
        raise AssertionError(f"pod {namespace}/{name} never ran (its watch ended)")

    def stop(self) -> None:
        """kwok's leftover exec processes, then kwok, the API server and etcd (SIGTERM, then KILL)."""
        self.kill_exec_processes()
        for name in ("kwok", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)  # etcd's data and the PKI: nothing kept


_shared: RealCluster | None = None


def shared_real_cluster() -> RealCluster | None:
    """The process's real cluster, started on first use and stopped at exit (or by
    :func:`stop_shared_real_cluster`); None when the binaries were not built on this machine
    (``make k8s-bed``)."""
    global _shared
    binaries = bed_bin()
    if binaries is None:
        return None
    if _shared is None:
        root = Path(tempfile.mkdtemp(prefix="rxk8s-", dir="/tmp"))
        cluster = RealCluster(root, binaries)
        atexit.register(cluster.stop)
        _shared = cluster.start()
    return _shared


def stop_shared_real_cluster() -> None:
    """Stop the process's real cluster now, if it runs (the next use starts another): an idle
    API server, etcd and kwok cost CPU for the rest of a run that no longer needs them."""
    global _shared
    cluster, _shared = _shared, None
    if cluster is not None:
        cluster.stop()


def real_cluster_running(cluster: RealCluster) -> bool:
    """Whether ``cluster`` is still the process's running one (not stopped meanwhile)."""
    return cluster is _shared
