#!/bin/bash
# Supervisor of one lab node: supervise.sh MACHINE systemd-nspawn ARGS...
# `lab` starts it in the node's cgroups. It runs systemd-nspawn and boots the
# node again when the node rebooted itself (nspawn exits 133, as
# systemd-nspawn@.service treats it); SIGTERM powers the node off for good.
set -u
machine=$1
shift
stopping=0
child=
trap 'stopping=1; [[ -n $child ]] && kill -TERM "$child" 2>/dev/null' TERM INT
while :; do
  "$@" &
  child=$!
  rc=0
  # wait returns early when a trapped signal arrives; keep waiting for nspawn itself.
  while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    rc=$?
  done
  if ((stopping == 0 && rc == 133)); then
    echo "[lab] $machine rebooted itself; booting it again"
    continue
  fi
  echo "[lab] $machine powered off (systemd-nspawn exit $rc)"
  exit "$rc"
done
