#!/usr/bin/env bash
# Installs Debian's Slurm, munge and Prometheus (the tests' fixtures start and stop them) and
# Chromium (tests/skills/test_report_browser.py opens the evidence report in it, headless);
# iproute2 for the sandbox's namespace nodes, and libslurm-dev to build pyslurm
# (tests/services/build_pyslurm.sh); MariaDB and slurmdbd for the sandbox's Slurm accounting
# (tenants as accounts, quotas as association/QOS limits).
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v ip >/dev/null && command -v tc >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
[ -f /usr/include/slurm/slurm.h ] || need+=(libslurm-dev)
command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null || need+=(mariadb-server)
command -v slurmdbd >/dev/null || need+=(slurmdbd)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
