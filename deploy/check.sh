#!/usr/bin/env bash
# Checks the systemd units in deploy/ with `systemd-analyze verify`, and that
# fstab.example says the same as mnt-pfs.mount.
#
# verify insists that ExecStart= binaries exist, so the units are checked as copies
# whose /usr/local/bin/pfs-* paths point at stub executables in a temporary
# directory. Any verify output about our units is a failure; output about the
# host's other units (pulled in as dependencies) is shown but ignored.
#
# Usage: deploy/check.sh   (needs systemd-analyze: apt-get install systemd)
set -euo pipefail

deploy_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
units=(pfs-master.service pfs-server.service mnt-pfs.mount)
binaries=(pfs-server pfs-fuse)

fail() {
    echo "check.sh: FAIL: $*" >&2
    exit 1
}

if ! command -v systemd-analyze >/dev/null 2>&1; then
    fail "systemd-analyze not found: install systemd (apt-get install -y systemd)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/pfs-deploy-check.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
mkdir "$work/bin" "$work/units"

for b in "${binaries[@]}"; do
    printf '#!/bin/sh\nexit 0\n' >"$work/bin/$b"
    chmod 0755 "$work/bin/$b"
done

# The copies keep their file names: a mount unit's name must match its Where=.
for u in "${units[@]}"; do
    [[ -f "$deploy_dir/$u" ]] || fail "$deploy_dir/$u is missing"
    sed -E "s#/usr/(local/)?bin/(pfs-server|pfs-fuse)#$work/bin/\\2#g" \
        "$deploy_dir/$u" >"$work/units/$u"
done
for u in pfs-master.service pfs-server.service; do
    grep -q "^ExecStart=$work/bin/pfs-server " "$work/units/$u" \
        || fail "$u: ExecStart= does not run /usr/local/bin/pfs-server (or /usr/bin)"
done

verify_args=()
# systemd >= 250: the exit status reflects only the units given, not the host's.
if systemd-analyze --help 2>&1 | grep -q -- '--recursive-errors'; then
    verify_args+=(--recursive-errors=no)
fi

status=0
output=$(cd "$work/units" && systemd-analyze verify "${verify_args[@]}" \
    "${units[@]/#/./}" 2>&1) || status=$?

# Lines that name one of our units (by unit name or by the copy's path).
pattern=$(printf '%s|' "${units[@]}" "$work")
pattern=${pattern%|}
ours=$(grep -E -- "$pattern" <<<"$output" || true)
others=$(grep -v -E -- "$pattern" <<<"$output" || true)

if [[ -n "$others" ]]; then
    echo "check.sh: ignoring systemd-analyze output about other units:"
    sed 's/^/    /' <<<"$others"
fi
if [[ -n "$ours" ]]; then
    echo "check.sh: systemd-analyze verify reported:" >&2
    sed 's/^/    /' <<<"$ours" >&2
    fail "the units have problems (see above)"
fi
if ((status != 0)); then
    if ((${#verify_args[@]} > 0)); then
        fail "systemd-analyze verify exited with status $status"
    fi
    echo "check.sh: systemd-analyze verify exited with status $status, with nothing" \
        "about our units (older systemd counts the host's units too): ignored"
fi
echo "check.sh: systemd-analyze verify: ${units[*]}: ok"

# fstab.example must mount the same thing as mnt-pfs.mount.
mount_key() {
    sed -n "s/^$1=//p" "$deploy_dir/mnt-pfs.mount"
}
read -r f_what f_where f_type f_opts f_dump f_pass f_extra < <(grep -v -E '^[[:space:]]*(#|$)' \
    "$deploy_dir/fstab.example")
[[ "$f_what" == "$(mount_key What)" ]] \
    || fail "fstab.example source $f_what differs from mnt-pfs.mount What=$(mount_key What)"
[[ "$f_where" == "$(mount_key Where)" ]] \
    || fail "fstab.example mount point $f_where differs from Where=$(mount_key Where)"
[[ "$f_type" == "$(mount_key Type)" ]] \
    || fail "fstab.example type $f_type differs from Type=$(mount_key Type)"
[[ "$f_dump $f_pass" == "0 0" && -z "$f_extra" ]] \
    || fail "fstab.example: expected six fields ending in dump 0 and pass 0"
IFS=, read -r -a unit_opts <<<"$(mount_key Options)"
for o in "${unit_opts[@]}"; do
    [[ ",$f_opts," == *",$o,"* ]] || fail "fstab.example lacks the mount option $o"
done
echo "check.sh: fstab.example matches mnt-pfs.mount: ok"
