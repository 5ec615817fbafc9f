#!/usr/bin/env bash
# Installs Debian's Slurm, munge and Prometheus (the tests' fixtures start and stop them) and
# Chromium (tests/skills/test_report_browser.py opens the evidence report in it, headless).
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
