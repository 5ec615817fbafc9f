"""Slurm accounting for a sandbox cluster: a private MariaDB (its own datadir, socket and port on
127.0.0.1) and a slurmdbd, both in the host's namespace, started before slurmctld so that
`AccountingStorageEnforce` holds from the first job. slurmctld (in its own namespace) and
sacctmgr (on the host) both reach slurmdbd over the bridge at NET.1. The pids go in the
sandbox's state, and `stop_accounting` signals exactly those, after the kernel confirms each
still runs this sandbox's datadir or slurm.conf."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

MARIADBD, INSTALL_DB, SLURMDBD = "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/sbin/slurmdbd"
DB_NAME, DB_USER = "slurm_acct_db", "slurm"


class AccountingError(RuntimeError):
    """Slurm accounting cannot be started or reached: says what failed and what to do."""


def conf_lines(spec) -> list[str]:
    """slurm.conf lines for the sandbox's accounting: limits and QOS enforced, GPUs a TRES, QOS priority counted."""
    return ["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={spec.net}.1",
            f"AccountingStoragePort={spec.dbd_port}", "AccountingStorageEnforce=associations,limits,qos",
            "AccountingStorageTRES=gres/gpu", "GresTypes=gpu", "PriorityType=priority/multifactor",
            "PriorityWeightQOS=10000"]


def _paths(state) -> dict[str, Path]:
    folder = Path(state.folder)
    return {"datadir": folder / "state" / "mariadb", "socket": folder / "state" / "mariadb.sock",
            "mariadb_pid": folder / "state" / "mariadb.pid", "dbd_conf": folder / "slurmdbd.conf",
            "dbd_pid": folder / "state" / "slurmdbd.pid", "log": folder / "log"}


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)
    if done.returncode != 0:
        raise AccountingError(f"`{' '.join(args[:3])} ...` failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return done


def _mariadb_answers(socket_path: Path) -> bool:
    return subprocess.run(["mysqladmin", "--no-defaults", f"--socket={socket_path}", "ping"], capture_output=True,
                          timeout=10).returncode == 0


def slurmdbd_answers(env: dict[str, str]) -> bool:
    """sacctmgr gets an answer from slurmdbd (the cluster list)."""
    try:
        return subprocess.run(["sacctmgr", "-n", "-p", "show", "cluster", "format=cluster"], capture_output=True,
                              timeout=15, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_accounting(state, env: dict[str, str], wait_until, save) -> None:
    """Make a fresh database, start MariaDB and slurmdbd, register the cluster (which creates root's
    association). Records each pid in `state` (and `save`s it) as soon as it runs."""
    missing = [path for path in (MARIADBD, INSTALL_DB, SLURMDBD) if not Path(path).exists()]
    if missing:
        raise AccountingError(f"missing on this host: {', '.join(missing)}; install Debian's mariadb-server and "
                              "slurmdbd (tests/services/install.sh)")
    paths, spec = _paths(state), state.spec
    _run([INSTALL_DB, "--no-defaults", f"--datadir={paths['datadir']}", "--user=root",
          "--auth-root-authentication-method=socket", "--skip-test-db"])
    with open(paths["log"] / "mariadb.log", "ab") as log:
        process = subprocess.Popen(
            [MARIADBD, "--no-defaults", f"--datadir={paths['datadir']}", "--user=root", f"--socket={paths['socket']}",
             f"--port={spec.mariadb_port}", "--bind-address=127.0.0.1", f"--pid-file={paths['mariadb_pid']}",
             "--skip-log-bin", "--innodb-buffer-pool-size=32M"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    state.mariadb_pid = process.pid
    save(state)
    wait_until(30, f"MariaDB on {paths['socket']} (see {paths['log']}/mariadb.log)",
               lambda: process.poll() is None and _mariadb_answers(paths["socket"]))
    password = secrets.token_hex(16)
    _run(["mariadb", "--no-defaults", f"--socket={paths['socket']}", "-u", "root", "-e",
          f"CREATE DATABASE {DB_NAME}; CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
          f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"])
    # slurmdbd has no -f: it reads slurmdbd.conf beside $SLURM_CONF, and only if mode 0600
    paths["dbd_conf"].write_text("\n".join([
        "AuthType=auth/munge", "DbdHost=localhost", f"DbdPort={spec.dbd_port}", "SlurmUser=root",
        "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={spec.mariadb_port}",
        f"StorageUser={DB_USER}", f"StoragePass={password}", f"StorageLoc={DB_NAME}",
        f"PidFile={paths['dbd_pid']}", f"LogFile={paths['log']}/slurmdbd.log"]) + "\n")
    paths["dbd_conf"].chmod(0o600)
    _run([SLURMDBD], env=env)  # it daemonizes and writes its pid file
    wait_until(15, f"slurmdbd to write {paths['dbd_pid']}", lambda: paths["dbd_pid"].is_file()
               and paths["dbd_pid"].read_text().strip().isdigit())
    state.slurmdbd_pid = int(paths["dbd_pid"].read_text().strip())
    save(state)
    wait_until(30, f"slurmdbd to answer sacctmgr (see {paths['log']}/slurmdbd.log)", lambda: slurmdbd_answers(env))
    _run(["sacctmgr", "-i", "add", "cluster", cluster_name(spec)], env=env)


def cluster_name(spec) -> str:
    return f"{spec.prefix}sandbox"


def _is_ours(pid: int | None, marker: str, environment: bool = False) -> bool:
    """The kernel says `pid` still runs with `marker` in its command line (or environment)."""
    if not pid:
        return False
    try:
        text = Path(f"/proc/{pid}/{'environ' if environment else 'cmdline'}").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return marker in text


def stop_accounting(state) -> list[str]:
    """SIGTERM the slurmdbd and MariaDB this sandbox started (only those), waiting for MariaDB to exit."""
    paths, stopped = _paths(state), []
    if _is_ours(state.slurmdbd_pid, f"SLURM_CONF={state.conf}", environment=True):
        os.kill(state.slurmdbd_pid, signal.SIGTERM)
        stopped.append(f"slurmdbd {state.slurmdbd_pid}")
    if _is_ours(state.mariadb_pid, f"--datadir={paths['datadir']}"):
        os.kill(state.mariadb_pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _is_ours(state.mariadb_pid, f"--datadir={paths['datadir']}"):
            time.sleep(0.1)
        stopped.append(f"mariadb {state.mariadb_pid}")
    return stopped


def accounting_status(state, env: dict[str, str]) -> dict:
    """What `trainops sandbox status` shows about accounting."""
    paths = _paths(state)
    return {"slurmdbd": f"{state.spec.net}.1:{state.spec.dbd_port}", "cluster": cluster_name(state.spec),
            "slurmdbd_running": _is_ours(state.slurmdbd_pid, f"SLURM_CONF={state.conf}", environment=True),
            "mariadb_running": _is_ours(state.mariadb_pid, f"--datadir={paths['datadir']}"),
            "answers": slurmdbd_answers(env)}
