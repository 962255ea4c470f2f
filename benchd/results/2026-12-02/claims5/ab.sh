#!/bin/bash
# run under the bench lock: alternate the shared controld between before/after (checkpoint pool runs), an empty cgroup of
# our own held frozen throughout (the kernel's freezer static key on for both, whatever key the controlds hold); restore main's at the end
set -u
cd /work/wt/claims5/benchd
out=/tmp/claims5/ab; mkdir -p $out
key=/sys/fs/cgroup/freezer/claims5-ab-key
mkdir -p $key && echo FROZEN > $key/freezer.state
for v in "$@"; do
  /work/main/deploy/controld-up.sh /tmp/claims5/$v/controld > $out/up.log 2>&1 || { echo "up $v failed"; cat $out/up.log; break; }
  sleep 2
  echo "$(date -u +%T) start $v $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/order.txt
  timeout 130 /work/main/bin/benchd run --out /tmp/claims5/abres --suite pool --pool-kinds checkpoint --pool-bursts 1,2,4,8 --n 6 > $out/run-$v-$(date -u +%H%M%S).log 2>&1
  f=$(ls -t /tmp/claims5/abres/2026-12-02/pool-*.json | head -1)
  echo "$(date -u +%T) end $v $f $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/order.txt
done
/work/main/deploy/controld-up.sh /work/main/bin/controld >> $out/up.log 2>&1
rmdir $key
echo "$(date -u +%T) restored main's controld" >> $out/order.txt
