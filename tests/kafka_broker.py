"""A real single-node Kafka broker (KRaft, loopback) for tests and benchmarks.

Kafka's jars come from Maven Central only: the first :func:`fetch` downloads Apache Maven
itself from there into the cache, resolves ``kafka_2.13`` and log4j2 (which Kafka's pom
leaves out) with a generated pom.xml, and keeps the jars for later runs. :class:`Broker`
runs one JVM that is both broker and controller, with its data and log under a work
folder; the cache also keeps a class-data archive of the broker's classes, made when the
first broker stops, which shortens later starts::

    with Broker(tmp_path) as b:
        produce_to(b.bootstrap)

From a shell (in the repository's root)::

    python -m tests.kafka_broker fetch
    python -m tests.kafka_broker run [--dir D] [--port P]

The cache is ``$RTINDEX_KAFKA_CACHE``, or ``~/.cache/rtindex/kafka-<version>``.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import functools
import hashlib
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Collection
from pathlib import Path

KAFKA_VERSION = "4.4.0"
LOG4J_VERSION = "2.26.1"
MAVEN_VERSION = "3.9.16"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
CENTRAL = "https://repo1.maven.org/maven2"
MAVEN_URL = (f"{CENTRAL}/org/apache/maven/apache-maven/{MAVEN_VERSION}/"
             f"apache-maven-{MAVEN_VERSION}-bin.tar.gz")
CACHE = Path(os.environ.get("RTINDEX_KAFKA_CACHE")
             or Path.home() / ".cache" / "rtindex" / f"kafka-{KAFKA_VERSION}")
JAVA_MIN = 17  # Kafka 4's broker runs on Java 17 and later

# Light on a small machine: a bounded heap, one GC thread, and a JVM that exits on OOM
# rather than limping on. log4j's own shutdown hook would end logging before Kafka's
# shutdown hook has said what it did.
JVM_OPTS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true", "-Dlog4j2.shutdownHookEnabled=false"]

POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rtindex.tests</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <!-- Kafka's pom leaves log4j2 out, yet the broker and the storage tool call its API
         at start (NoClassDefFoundError without it), and they log through slf4j 1.x:
         log4j-core and the slf4j binding bring the API and make them write a log. -->
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""

SETTINGS = f"""<?xml version="1.0" encoding="UTF-8"?>
<settings xmlns="http://maven.apache.org/SETTINGS/1.2.0">
  <mirrors>
    <mirror><id>central</id><mirrorOf>*</mirrorOf><url>{CENTRAL}</url></mirror>
  </mirrors>
</settings>
"""

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
"""

MARKER = ".complete"
RECIPE = re.sub(r"\s*<!--.*?-->", "", POM, flags=re.S)  # what the marker must hold
ERROR_LINE = re.compile(r"(\[[^]]*\] )?(ERROR|FATAL)\b|Caused by|Exception in")


def say(msg: str) -> None:
    """Progress for a person watching: stderr, so stdout stays for what a caller reads."""
    print(f"kafka_broker: {msg}", file=sys.stderr, flush=True)


# -- what this machine has ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def java_banner(java: str) -> str:
    """What ``java -version`` says (it says it on stderr); empty when it cannot run."""
    try:
        return subprocess.run([java, "-version"], capture_output=True, text=True,
                              timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def java_version(java: str) -> int | None:
    """The major version of ``java`` (8 for "1.8.0"), or None when it does not say."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', java_banner(java))
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def why_not() -> str | None:
    """Why a broker cannot run here (no POSIX, no java, too old a java), or None.

    Says nothing of the network: a first fetch that cannot reach Maven Central fails loudly.
    """
    if os.name != "posix":
        return "the Kafka broker script needs a POSIX system"
    java = shutil.which("java")
    if java is None:
        return "java is not on PATH"
    version = java_version(java)
    if version is None:
        return f"{java} -version does not say its version"
    if version < JAVA_MIN:
        return f"Kafka {KAFKA_VERSION} needs Java {JAVA_MIN} or later, {java} is Java {version}"
    return None


# -- fetching the jars -------------------------------------------------------------------

def jars_dir(cache: Path | None = None) -> Path:
    """Where the jars live once fetched."""
    return (cache or CACHE) / "jars"


def fetched(cache: Path | None = None) -> bool:
    """True when a complete fetch of the current recipe is in the cache.

    The marker holds the pom it was made from, so a changed recipe fetches again.
    """
    marker = jars_dir(cache) / MARKER
    try:
        return marker.read_text() == RECIPE
    except OSError:
        return False


@contextlib.contextmanager
def cache_lock(cache: Path):
    """An exclusive lock on the cache, so two processes never fetch into it at once."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process fetching into {cache}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch(cache: Path | None = None) -> Path:
    """The folder of Kafka's jars, downloading and resolving them only the first time.

    The jars are resolved into a temporary folder that gets its marker and is then renamed
    into place, so a fetch cut short is never taken as done; a lock on the cache makes a
    second process wait for the first one and then reuse its result.
    """
    cache = Path(cache or CACHE)
    if fetched(cache):
        return jars_dir(cache)
    with cache_lock(cache):
        if fetched(cache):
            return jars_dir(cache)
        start = time.monotonic()
        for old in cache.glob(".tmp-*"):
            shutil.rmtree(old, ignore_errors=True)
        mvn = maven(cache)
        resolve(mvn, cache)
        shutil.rmtree(cache / "m2", ignore_errors=True)  # the jars are copied out of it
        say(f"Kafka {KAFKA_VERSION} ready in {jars_dir(cache)} "
            f"({time.monotonic() - start:.0f} s)")
    return jars_dir(cache)


def download(url: str, dest: Path) -> None:
    """``url`` to ``dest``, checked against the .sha512 that Maven Central serves beside it."""
    say(f"downloading {url}")
    digest = hashlib.sha512()
    with urllib.request.urlopen(url, timeout=120) as r, open(dest, "wb") as out:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    with urllib.request.urlopen(url + ".sha512", timeout=120) as r:
        expected = r.read().decode().split()[0].lower()
    if digest.hexdigest() != expected:
        raise RuntimeError(f"{url}: sha512 does not match the published one")


def maven(cache: Path) -> Path:
    """The ``mvn`` script of Apache Maven in the cache, downloaded from Maven Central once."""
    home = cache / "maven" / f"apache-maven-{MAVEN_VERSION}"
    mvn = home / "bin" / "mvn"
    if mvn.exists():
        return mvn
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-maven-", dir=cache))
    try:
        tarball = tmp / "maven.tar.gz"
        download(MAVEN_URL, tarball)
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        home.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp / home.name, home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return mvn


def resolve(mvn: Path, cache: Path) -> None:
    """Kafka's runtime jars into ``cache/jars`` via ``dependency:copy-dependencies``."""
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-jars-", dir=cache))
    try:
        (tmp / "pom.xml").write_text(POM)
        (tmp / "settings.xml").write_text(SETTINGS)
        out = tmp / "jars"
        cmd = [str(mvn), "-B", "-ntp", "-s", str(tmp / "settings.xml"), "-f", str(tmp / "pom.xml"),
               f"-Dmaven.repo.local={cache / 'm2'}", f"{DEPENDENCY_PLUGIN}:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
        say(f"resolving org.apache.kafka:kafka_2.13:{KAFKA_VERSION} with Maven {MAVEN_VERSION}")
        log = tmp / "maven.log"
        with open(log, "wb") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=tmp).returncode
        if rc != 0 or not any(out.glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"Maven could not resolve Kafka (exit {rc}):\n{tail(log, 0, 30)}")
        (out / MARKER).write_text(RECIPE)
        say(f"{len(list(out.glob('*.jar')))} jars resolved")
        shutil.rmtree(jars_dir(cache), ignore_errors=True)  # an older recipe's
        for old in cache.glob("cds-*.jsa"):  # class-data archives of the older jars
            old.unlink()
        os.rename(out, jars_dir(cache))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- asking a broker whether it is up ----------------------------------------------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        buf += chunk
    return buf


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of the flexible Kafka encodings at ``pos``: (value, next pos)."""
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _call(sock: socket.socket, api_key: int, version: int, body: bytes,
          flexible: bool) -> bytes:
    """One request/response round trip; the response body, past its header."""
    correlation = random.randrange(1 << 31)
    client = b"rtindex-probe"
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    msg = header + (b"\x00" if flexible else b"") + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    data = _recv_exact(sock, size)
    if struct.unpack_from(">i", data)[0] != correlation:
        raise ConnectionError("a response to another request")
    pos = 4
    if flexible:  # response header v1: skip its tagged fields
        count, pos = _varint(data, pos)
        for _ in range(count):
            _, pos = _varint(data, pos)
            size, pos = _varint(data, pos)
            pos += size
    return data[pos:]


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    """ApiVersions v0: {api key: (min version, max version)} that the broker serves."""
    body = _call(sock, 18, 0, b"", flexible=False)
    error, count = struct.unpack_from(">hi", body)
    if error:
        raise ConnectionError(f"ApiVersions answered error {error}")
    return {k: (lo, hi) for k, lo, hi in struct.iter_unpack(">hhh", body[6:6 + 6 * count])}


def _broker_count(sock: socket.socket) -> int:
    """Metadata v12 for no topic: how many live brokers the cluster reports."""
    body = _call(sock, 3, 12, b"\x01\x00\x00\x00", flexible=True)  # [] no-auto no-authz {}
    count, _ = _varint(body, 4)  # past throttle_time_ms; a compact array stores count + 1
    return count - 1


def ping(host: str, port: int, timeout: float = 5.0) -> int:
    """How many brokers a Kafka server at host:port reports; raises OSError when it can't say.

    ApiVersions proves it speaks Kafka; Metadata lists only brokers that the controller has
    let in, so a positive count means clients can produce and consume.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        apis = _api_versions(sock)
        lo, hi = apis.get(3, (0, -1))
        if not lo <= 12 <= hi:
            return 1  # a Metadata encoding this probe does not speak: ApiVersions will do
        return _broker_count(sock)


# -- running a broker --------------------------------------------------------------------

_CHILDREN: set[subprocess.Popen] = set()


@atexit.register
def _kill_children() -> None:
    """No broker outlives the Python process that started it, even when it forgot to stop."""
    for p in list(_CHILDREN):
        with contextlib.suppress(OSError):
            p.kill()
            p.wait()


def free_port(taken: Collection[int] = ()) -> int:
    """A free loopback port below the kernel's ephemeral range.

    A client that keeps reconnecting to a stopped broker gets ephemeral local ports; if the
    broker's own port were one of them, a connection could land on itself and keep the
    port from the broker when it comes back.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(min(10000, low - 1000), low)
        if port not in taken and _bindable(port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    """True when nothing listens on the loopback port. SO_REUSEADDR as the JVM sets it, so
    connections of a stopped broker still in TIME_WAIT do not count."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64, never starting with '-'
    (the storage tool would take it for an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def java() -> str:
    """The java on PATH."""
    return shutil.which("java") or "java"


def classpath(jars: Path) -> str:
    """The jars in a fixed order: a class-data archive is only valid for the same path."""
    return os.pathsep.join(str(j) for j in sorted(jars.glob("*.jar")))


def cds_archive(jars: Path) -> Path:
    """Where the class-data archive of the broker's classes lives: beside the jars, named
    after the java build and the class path, since it fits only those."""
    key = hashlib.sha256((java_banner(java()) + classpath(jars)).encode()).hexdigest()[:12]
    return jars.parent / f"cds-{key}.jsa"


def tail(path: Path, offset: int = 0, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` from byte ``offset`` on (the current run's)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Broker:
    """One JVM that is Kafka broker and KRaft controller, listening on 127.0.0.1.

    Everything lives under ``workdir``: ``data/`` (the log dirs), ``server.properties``,
    ``broker.log`` and ``broker.state`` (cluster id and ports). A port picked for
    ``port=0`` is kept for restarts, and for a later Broker on the same workdir, so a
    client's bootstrap address stays valid when the broker goes away and comes back.
    ``config`` adds or overrides server properties.
    """

    def __init__(self, workdir: str | Path, port: int = 0, partitions: int = 1,
                 auto_create_topics: bool = False, config: dict[str, object] | None = None):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.auto_create_topics = auto_create_topics
        self.extra = dict(config or {})
        state = self._read_state()
        self.cluster_id = state.get("cluster_id") or random_cluster_id()
        self.port = port or int(state.get("port", 0)) or free_port()
        self.controller_port = (int(state.get("controller_port", 0))
                                or free_port({self.port}))
        self._write_state()
        self._proc: subprocess.Popen | None = None
        self._archive: Path | None = None  # the class-data archive (see _cds_opts)
        self._dumping: Path | None = None  # where the JVM writes it, when it does
        self._log_offset = 0

    # where things are
    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    def answers(self, timeout: float = 5.0) -> bool:
        """True when the broker speaks Kafka on its port and reports itself live."""
        try:
            return ping("127.0.0.1", self.port, timeout) > 0
        except (OSError, struct.error, IndexError):
            return False

    # state kept across restarts
    def _read_state(self) -> dict[str, str]:
        path = self.workdir / "broker.state"
        if not path.exists():
            return {}
        return dict(line.split("=", 1) for line in path.read_text().split() if "=" in line)

    def _write_state(self) -> None:
        (self.workdir / "broker.state").write_text(
            f"cluster_id={self.cluster_id}\nport={self.port}\n"
            f"controller_port={self.controller_port}\n")

    def properties(self) -> dict[str, object]:
        """The server properties: a combined node whose internal topics fit one broker."""
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": self.partitions,
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            # After a SIGKILL the controller keeps the dead broker's registration until its
            # heartbeats are overdue, and the restarted broker waits for that.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 4000,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "log.cleaner.dedupe.buffer.size": 16 << 20,  # allocated up front on the heap
        }
        props.update(self.extra)
        return props

    def _write_config(self) -> Path:
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)
        return path

    def _java(self, jars: Path, main: str, *args: str, opts: list[str]) -> list[str]:
        return [java(), *opts, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", classpath(jars), main, *args]

    def _format(self, jars: Path, config: Path, timeout: float) -> None:
        """Formats the log dirs with the cluster id, the first time only."""
        offset = self._log_size()
        archive = cds_archive(jars)
        cds = [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []
        cmd = self._java(jars, "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                         "-c", str(config), opts=["-Xmx256m", "-XX:+UseSerialGC", *cds])
        with open(self.log_path, "ab") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout).returncode
        if rc != 0:
            raise RuntimeError(f"formatting {self.data_dir} failed (exit {rc}):\n"
                               f"{tail(self.log_path, offset)}")

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def start(self, timeout: float = 90) -> Broker:
        """Starts the JVM and returns once the broker answers on its port.

        The first fetch is not counted in ``timeout``. Raises RuntimeError with the end of
        the broker's log when it exits or does not answer in time (and then kills it).
        """
        if self.running:
            return self
        for port in (self.port, self.controller_port):
            if not _bindable(port):
                raise RuntimeError(f"port {port} on 127.0.0.1 is taken: the Kafka broker "
                                   f"in {self.workdir} cannot listen there")
        jars = fetch()
        deadline = time.monotonic() + timeout
        config = self._write_config()
        if not (self.data_dir / "meta.properties").exists():
            self._format(jars, config, timeout)
        self._log_offset = self._log_size()
        cmd = self._java(jars, "kafka.Kafka", str(config), opts=JVM_OPTS + self._cds_opts(jars))
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        _CHILDREN.add(self._proc)
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.kill()
            raise
        return self

    def _cds_opts(self, jars: Path) -> list[str]:
        """JVM options for the class-data archive: use it, or make it when this broker stops.

        Loading Kafka's classes from an archive of a previous run cuts the start noticeably;
        the first broker to stop cleanly writes the archive (to a temporary name, renamed
        once whole), and a JVM that finds an archive it cannot use runs without it.
        """
        self._archive = cds_archive(jars)
        if self._archive.exists():
            self._dumping = None
            return [f"-XX:SharedArchiveFile={self._archive}"]
        self._dumping = self._archive.with_name(
            f".tmp-cds-{os.getpid()}-{random.randrange(1 << 30)}")
        return [f"-XX:ArchiveClassesAtExit={self._dumping}", "-Xlog:cds=off"]

    def _keep_archive(self, clean: bool) -> None:
        """After the JVM exits: the archive it wrote moves into place, if it exited cleanly."""
        tmp, self._dumping = self._dumping, None
        if tmp is None:
            return
        if clean and tmp.exists() and tmp.stat().st_size > 0:
            os.replace(tmp, self._archive)
        else:
            tmp.unlink(missing_ok=True)

    def _wait_ready(self, deadline: float) -> None:
        while not self.answers(timeout=2):
            if not self.running:
                raise RuntimeError(f"the Kafka broker exited (code {self._proc.returncode})"
                                   f"\n{self.log_report()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Kafka broker did not answer on {self.bootstrap} in "
                                   f"time\n{self.log_report()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log since its last start."""
        return tail(self.log_path, self._log_offset, lines)

    def log_report(self) -> str:
        """For a failure: the log's error lines of this run (the cause is seldom among the
        last lines once Kafka has logged its shutdown), then its last lines."""
        text = tail(self.log_path, self._log_offset, lines=10**6).splitlines()
        errors = [ln for ln in text if ERROR_LINE.match(ln)]
        return (f"errors in {self.log_path}:\n" + "\n".join(errors[-15:]) +
                f"\nlast lines:\n" + "\n".join(text[-25:]))

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL when it takes longer than ``timeout``."""
        p = self._proc
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self._keep_archive(clean=False)
        self._keep_archive(clean=True)
        self._forget()

    def kill(self) -> None:
        """SIGKILL: the broker dies at once, as in a crash; its data stays for a restart."""
        p = self._proc
        if p is None:
            return
        if p.poll() is None:
            p.kill()
        p.wait()
        self._keep_archive(clean=False)
        self._forget()

    def _forget(self) -> None:
        _CHILDREN.discard(self._proc)
        self._proc = None

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Broker({str(self.workdir)!r}, bootstrap={self.bootstrap!r}, {state})"


# -- command line ------------------------------------------------------------------------

def _run(args: argparse.Namespace) -> int:
    """Runs a broker until Ctrl-C or SIGTERM; its bootstrap address goes to stdout."""
    reason = why_not()
    if reason:
        say(reason)
        return 1
    with contextlib.ExitStack() as stack:
        workdir = args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-"))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        broker = Broker(workdir, port=args.port, partitions=args.partitions,
                        auto_create_topics=args.auto_create)
        started = time.monotonic()
        with broker:
            say(f"up in {time.monotonic() - started:.1f} s; data and log in {broker.workdir}")
            print(broker.bootstrap, flush=True)
            try:
                while broker.running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                say("stopping")
                return 0
            say(f"the broker exited:\n{broker.log_report()}")
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kafka_broker",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="download Kafka's jars into the cache")
    run = sub.add_parser("run", help="run a broker until Ctrl-C")
    run.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    run.add_argument("--port", type=int, default=0, help="listener port (default: a free one)")
    run.add_argument("--partitions", type=int, default=1, help="partitions of a new topic")
    run.add_argument("--auto-create", action="store_true", help="create topics on first use")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "fetch":
            print(fetch())
            return 0
        return _run(args)
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
