"""A real Slurm cluster on this machine for tests: munged, slurmctld and slurmd n1/n2 on localhost.

Debian's `slurm-wlm` and `munge` packages (`apt-get install -y slurm-wlm munge`) as root. All
state (munge key and socket, slurm.conf, spool, logs) lives in one temporary directory; the
daemons run in the foreground as our children and are stopped by `stop()`. Slurm client
commands find the cluster through `env()` (SLURM_CONF).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.support.waiting import wait_until

NODES = ("n1", "n2")
NODE_SET = "gpus"  # a NodeSet of every node
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "sbatch", "scontrol",
            "squeue")
INSTALL_HINT = ("Slurm test harness needs Debian's slurm-wlm and munge, run as root: "
                "apt-get update && apt-get install -y slurm-wlm munge")


class SlurmUnavailable(RuntimeError):
    """The Slurm binaries are missing or we are not root."""


def missing() -> str | None:
    """Why a Slurm cluster cannot be started here, or None when it can."""
    absent = [b for b in BINARIES if shutil.which(b) is None
              and not Path("/usr/sbin", b).exists()]
    if absent:
        return f"missing {', '.join(absent)}; {INSTALL_HINT}"
    if os.geteuid() != 0:
        return f"not root; {INSTALL_HINT}"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """One slurmctld and a slurmd per node name (`-N n1`, `-N n2` unless `nodes` says more),
    each with its own Port=."""

    def __init__(self, root: Path | None = None, extra_conf: Sequence[str] = (),
                 nodes: Sequence[str] = NODES) -> None:
        self.nodes = tuple(nodes)  # each a slurmd `-N <name>` on localhost
        self.root = root or Path(tempfile.mkdtemp(prefix="fw-slurm-"))
        self.extra_conf = tuple(extra_conf)  # slurm.conf lines added (e.g. RequeueExit=...)
        self.name = "fw" + uuid.uuid4().hex[:8]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # ---- environment for clients --------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0
            ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (argv list, never a shell)."""
        return subprocess.run([_exe(argv[0]), *argv[1:]], env=self.env(), text=True,
                              capture_output=True, check=check, timeout=timeout)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        why = missing()
        if why:
            raise SlurmUnavailable(why)
        for d in ("munge", "state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o711)  # munged wants the socket dir traversable
        key = self.root / "munge" / "munge.key"
        subprocess.run([_exe("mungekey"), "--create", f"--keyfile={key}", "--force"],
                       check=True, capture_output=True)
        key.chmod(0o600)
        self._spawn("munged", [_exe("munged"), "-F", "-f", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--log-file={self.root}/log/munged.log",
                               f"--pid-file={self.root}/munge/munged.pid",
                               f"--seed-file={self.root}/munge/seed"])
        self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged socket")
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        self.conf.write_text(self._conf_text(ctld_port, node_ports))
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-f", str(self.conf)])
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [_exe("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
        self._wait(self.all_idle, timeout_s, f"sinfo showing {', '.join(self.nodes)} idle")

    def _conf_text(self, ctld_port: int, node_ports: list[int]) -> str:
        r = self.root
        lines = [
            f"ClusterName={self.name}",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also delays a requeued job's restart (default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/linear",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=2",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "KillWait=5",
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            *self.extra_conf,
        ]
        # lower Weight is allocated first: a job lands on n1 while n1 is usable
        for i, (n, port) in enumerate(zip(self.nodes, node_ports, strict=True), start=1):
            lines.append(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs=1 RealMemory=256 Weight={i} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        # a node set: `scontrol update nodename=gpus` reaches both nodes (test_slurm.py
        # checks that faultwatch never gives Slurm such a name)
        lines.append(f"NodeSet={NODE_SET} Nodes={','.join(self.nodes)}")
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - child owns it
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env(), start_new_session=True)
        out.close()

    def _wait(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        def probe() -> bool:
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"Slurm harness: waiting for {what} failed "
                                   f"(exited: {dead}); logs:\n{self.logs_tail()}")
            return cond()

        wait_until(probe, timeout_s, f"Slurm: {what}", interval_s=0.2,
                   detail=lambda: f"logs:\n{self.logs_tail()}")

    def wait_for(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll a condition over the cluster's state (sinfo/squeue/scontrol) until true."""
        self._wait(cond, timeout_s, what)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._kill_step_daemons()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_step_daemons(self) -> None:
        """slurmd's step daemons (`slurmstepd: [N.batch]`) leave slurmd's session and outlive
        it, with the job's processes under them: kill the ones working in this cluster's
        directory (their cwd or an open file under it) and everything they started, so a
        stopped cluster leaves no process behind."""
        root = str(self.root.resolve())
        parent: dict[int, int] = {}
        stepds: list[int] = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                parent[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                if (proc / "comm").read_text().strip() != "slurmstepd":
                    continue
                paths = [os.readlink(proc / "cwd")]
                paths += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            except (OSError, IndexError, ValueError):
                continue
            if any(x == root or x.startswith(root + "/") for x in paths):
                stepds.append(int(proc.name))
        doomed, todo = [], list(stepds)
        while todo:  # each step daemon and its descendants (the job's processes)
            pid = todo.pop()
            doomed.append(pid)
            todo += [c for c, pp in parent.items() if pp == pid]
        for pid in reversed(doomed):  # children first
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    # ---- state queries ------------------------------------------------------------------

    def node_states(self) -> dict[str, str]:
        """{node: state} from `sinfo -N` (states lowercased, e.g. idle, alloc, drain)."""
        r = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        if r.returncode != 0:
            return {}
        out: dict[str, str] = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1].lower()
        return out

    def all_idle(self) -> bool:
        st = self.node_states()
        return all(st.get(n) == "idle" for n in self.nodes)

    def node_info(self, node: str) -> dict[str, str]:
        return _kv(self.run("scontrol", "show", "node", node, check=False).stdout)

    def job_info(self, job_id: str) -> dict[str, str]:
        return _kv(self.run("scontrol", "show", "job", job_id, check=False).stdout)

    def logs_tail(self, n: int = 30) -> str:
        chunks = []
        for f in sorted((self.root / "log").glob("*")):
            try:
                lines = f.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                continue
            chunks.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(chunks)


def _kv(text: str) -> dict[str, str]:
    """`scontrol show` output as a dict (Reason= takes the rest of its line)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            out["Reason"] = line[len("Reason="):]
            continue
        for tok in line.split():
            if "=" in tok:
                k, _, v = tok.partition("=")
                out.setdefault(k, v)
    return out
