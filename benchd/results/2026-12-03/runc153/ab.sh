#!/bin/bash
# alternate runc 1.1.5 (debian) and 1.5.3 in /usr/local/sbin
set -u
cd /work/main
rounds=${ROUNDS:-4}
for r in $(seq 1 $rounds); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for v in $order; do
    if [ $v = new ]; then cp /tmp/runc15/runc /usr/local/sbin/runc.tmp && mv /usr/local/sbin/runc.tmp /usr/local/sbin/runc; else rm -f /usr/local/sbin/runc; fi
    hash -r
    load=$(cut -d' ' -f1 /proc/loadavg)
    s0=$(awk '/^cpu /{print $2+$3+$4+$6+$7+$8}' /proc/stat)
    ./bin/benchd run --suite fork --fork-ns ${NS:-1,16} --fork-reps ${REPS:-3} --fork-podman=false --fork-ram-mb 0 --fork-restore eager --fork-lazy-ns 1 --fork-ksm-wait 0 --out /tmp/rab/ab/$v-r$r > /tmp/rab/ab/$v-r$r.log 2>&1
    rc=$?
    s1=$(awk '/^cpu /{print $2+$3+$4+$6+$7+$8}' /proc/stat)
    echo "round $r $v rc=$rc load=$load cpu_ticks=$((s1-s0))" | tee -a /tmp/rab/ab/runs.txt
  done
done
rm -f /usr/local/sbin/runc
