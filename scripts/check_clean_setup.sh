#!/usr/bin/env bash
# Runs scripts/setup.sh in a minimal Debian 12 root that holds nothing but what setup.sh itself
# installs, so a package that this machine happens to have (installed by hand, by
# scripts/gpu_deps.sh, or pulled in as a Recommends elsewhere) cannot hide a missing install step.
# .ci/run calls it before the tests.
#
#   bash scripts/check_clean_setup.sh              # packages + pip + CMake configure (the default)
#   bash scripts/check_clean_setup.sh build        # ... and the full build (shares ccache)
#   bash scripts/check_clean_setup.sh quickstart   # the README's two Quick start commands
#   bash scripts/check_clean_setup.sh shell        # leaves you in the prepared root (debugging)
#
# Needs root (chroot, bind mounts) and the Debian and PyPI registries. The root is made by
# mmdebstrap --variant=minbase (installed if missing) and cached as a tarball for a week; apt's
# .deb files and pip's downloads are cached between runs (TD_CLEAN_ROOT_CACHE, default
# ~/.cache/tardelli/clean-root), so a warm run installs from local files: about 3-4 minutes on
# 2 cores, most of it unpacking PyTorch.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
what="${1:-configure}"
case "${what}" in
  configure | build | quickstart | shell) ;;
  *)
    echo "check_clean_setup: the argument must be configure, build, quickstart or shell, got" \
      "'${what}'" >&2
    exit 2
    ;;
esac
if [[ "$(id -u)" -ne 0 ]]; then
  echo "check_clean_setup: needs root (chroot and bind mounts)" >&2
  exit 2
fi

cache="${TD_CLEAN_ROOT_CACHE:-${HOME:-/root}/.cache/tardelli/clean-root}"
mkdir -p "${cache}/apt-archives/partial" "${cache}/pip"
base="${cache}/bookworm-minbase.tar"

if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "check_clean_setup: installing mmdebstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends mmdebstrap </dev/null >/dev/null
fi
if [[ ! -f "${base}" || -n "$(find "${base}" -mtime +7 2>/dev/null)" ]]; then
  echo "check_clean_setup: making a minimal Debian 12 root (mmdebstrap --variant=minbase)"
  rm -rf "${base}" "${base%.tar}.new.tar"
  # mmdebstrap picks the output format from the name's extension: keep it .tar.
  mmdebstrap --quiet --variant=minbase --mode=root bookworm "${base%.tar}.new.tar"
  mv "${base%.tar}.new.tar" "${base}"
fi

root="$(mktemp -d /tmp/td-clean-root.XXXXXX)"
mounts=()
bind() {  # bind SRC DST-inside-root (recursively: /dev brings /dev/shm and /dev/pts along)
  mkdir -p "${root}$2"
  mount --rbind "$1" "${root}$2"
  mount --make-rslave "${root}$2"
  mounts+=("${root}$2")
}
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[i]}" 2>/dev/null || umount -R -l "${mounts[i]}" || true
  done
  # Never delete through a mount that is still there (a bound /dev would take the host's).
  if grep -q " ${root}" /proc/mounts; then
    echo "check_clean_setup: mounts remain under ${root}; not removing it" >&2
    return
  fi
  rm -rf "${root}"
}
trap cleanup EXIT

tar -C "${root}" -xf "${base}"
# What describes this network rather than this machine's packages goes in: name resolution, and
# the extra CA certificates (an egress proxy's) with pip's settings to use them; the
# ca-certificates package that setup.sh installs then trusts them. Local wheel folders
# (PIP_FIND_LINKS) do not: a bare machine has none.
cp /etc/resolv.conf "${root}/etc/resolv.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "${root}/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "${root}/usr/local/share/ca-certificates/"
fi
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "${root}/etc/pip.conf"
# The checkout as CI sees it: tracked files plus untracked ones that git does not ignore.
mkdir -p "${root}/src"
git ls-files -z --cached --others --exclude-standard |
  (while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done) |
  tar --null -T - -cf - | tar -C "${root}/src" -xf -

mount -t proc proc "${root}/proc" && mounts+=("${root}/proc")
mount -t sysfs -o ro sysfs "${root}/sys" && mounts+=("${root}/sys")  # hwloc (OpenMPI) reads it
bind /dev /dev
bind "${cache}/apt-archives" /var/cache/apt/archives
bind "${cache}/pip" /root/.cache/pip
if [[ "${what}" != configure ]]; then
  ccache_dir="${CCACHE_DIR:-${HOME:-/root}/.cache/ccache}"
  mkdir -p "${ccache_dir}"
  bind "${ccache_dir}" /root/.cache/ccache
fi

network_env=()
for v in PIP_CERT REQUESTS_CA_BUNDLE SSL_CERT_FILE PIP_INDEX_URL PIP_EXTRA_INDEX_URL http_proxy \
  https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY; do
  [[ -n "${!v:-}" ]] && network_env+=("${v}=${!v}")
done
env_in_root=(env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8 CI=true TD_SETUP_UNTIL="${what}" CCACHE_DIR=/root/.cache/ccache
  PIP_DISABLE_PIP_VERSION_CHECK=1 "${network_env[@]}")
if [[ "${what}" == shell ]]; then
  chroot "${root}" "${env_in_root[@]}" TD_SETUP_UNTIL=build bash -c "cd /src && exec bash -i"
  exit 0
fi

if [[ "${what}" == quickstart ]]; then
  # As a new user types them: no CI variable, the default preset.
  what_run="bash scripts/demo.sh && bash scripts/test.sh"
  env_in_root=(env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    LANG=C.UTF-8 CCACHE_DIR=/root/.cache/ccache PIP_DISABLE_PIP_VERSION_CHECK=1
    "${network_env[@]}")
  log="${TD_CLEAN_ROOT_LOG:-/tmp/td-clean-root-quickstart.log}"
else
  what_run="bash scripts/setup.sh"
  log="${root}/setup.log"
fi
echo "check_clean_setup: '${what_run}' (until ${what}) in a minimal Debian 12 root"
start=$SECONDS
if chroot "${root}" "${env_in_root[@]}" bash -c "cd /src && ${what_run}" >"${log}" 2>&1; then
  echo "check_clean_setup: OK in $((SECONDS - start)) s ('${what_run}' on a bare root)"
  if [[ "${what}" == quickstart ]]; then tail -n 3 "${log}"; fi
else
  rc=$?
  tail -n 40 "${log}" >&2
  echo "check_clean_setup: FAILED (exit ${rc}) after $((SECONDS - start)) s: '${what_run}'" \
    "does not work on a bare Debian 12 machine; its log ends above" >&2
  exit 1
fi
