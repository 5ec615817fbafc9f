#!/usr/bin/env bash
# Builds pyslurm 22.5.3 (the release matching Debian 12's Slurm 22.05) from the unmodified upstream
# source in ../shared/vendor/ and installs it into the project venv. The wheel is cached under
# ~/.cache/trainops/pyslurm/<sha256 of the archive>/, so only the first run pays the ~10 min of
# Cython + gcc on 2 cores. Usage: build_pyslurm.sh VENV_BIN
set -euo pipefail
venv_bin=${1:?usage: build_pyslurm.sh VENV_BIN}
here=$(cd "$(dirname "$0")/../.." && pwd)
archive=${PYSLURM_ARCHIVE:-$here/../shared/vendor/pyslurm-22.5.3.tar.gz}
if [ ! -f "$archive" ]; then
  echo "build_pyslurm: $archive not found; the Slurm backend will use the Slurm CLI" >&2
  exit 0
fi
sum=$(sha256sum "$archive" | cut -d' ' -f1)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/trainops/pyslurm/$sum
if ! ls "$cache"/pyslurm-22.5.3-*.whl >/dev/null 2>&1; then
  command -v gcc >/dev/null || { echo "build_pyslurm: gcc is needed" >&2; exit 1; }
  [ -f /usr/include/slurm/slurm.h ] || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq libslurm-dev >/dev/null; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m venv "$work/buildvenv"
  "$work/buildvenv/bin/pip" install -q "setuptools==59.2.0" "wheel==0.37.0" "Cython>=0.29.30,<3.0"
  tar -xzf "$archive" -C "$work"
  src=$(find "$work" -maxdepth 1 -type d -name 'pyslurm*' | head -n 1)
  mkdir -p "$cache"
  (cd "$src" && SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu SLURM_INCLUDE_DIR=/usr/include \
     "$work/buildvenv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$cache" .)
fi
"$venv_bin/pip" install -q --no-deps "$cache"/pyslurm-22.5.3-*.whl
echo "build_pyslurm: pyslurm 22.5.3 installed from $cache"
